"""Our answers to the exercises of notebook 03 (causal masking). The checks are in
``checks/03_causal_masking.py``; try the exercises before reading on."""
import numpy as np

import linattn


# ---- Exercise 1: the chunked form without a loop over the blocks ----------------------------

def chunked_causal_vectorized(q, k, v, chunk_size, eps=1e-6):
    """Algorithm 3 with every block at once, N a multiple of C: (N/C, C, .) blocks, each
    block's K_b^T [V_b, 1], and the state entering block b, the sum over the blocks BEFORE it
    (an exclusive cumulative sum)."""
    phi = linattn.EluPlusOne()
    n, c = q.shape[0], chunk_size
    phi_q = phi.forward(q).reshape(n // c, c, -1)                 # (blocks, C, F)
    phi_k = phi.forward(k).reshape(n // c, c, -1)
    v1 = np.concatenate([v, np.ones((n, 1))], axis=1).reshape(n // c, c, -1)   # (blocks, C, M+1)
    per_block = np.swapaxes(phi_k, 1, 2) @ v1                     # (blocks, F, M + 1)
    entering = np.cumsum(per_block, axis=0) - per_block           # sum over earlier blocks
    inside = np.tril(phi_q @ np.swapaxes(phi_k, 1, 2)) @ v1       # (blocks, C, M + 1)
    num_den = (inside + phi_q @ entering).reshape(n, -1)
    return num_den[:, :-1] / (num_den[:, -1:] + eps)


# ---- Exercise 2: a sliding window from two running sums -------------------------------------

def windowed_linear_attention(q, k, v, window, eps=1e-6):
    """Query i sees keys i - W + 1 .. i: the window's sums are S_i - S_{i-W} and
    Z_i - Z_{i-W}, differences of the running sums of Eq. (10)-(11)."""
    phi = linattn.EluPlusOne()
    phi_q, phi_k = phi.forward(q), phi.forward(k)
    n, f = phi_k.shape
    v1 = np.concatenate([v, np.ones((n, 1))], axis=1)
    S = np.zeros((f, v1.shape[1]))
    out = np.empty((n, v1.shape[1]))
    for i in range(n):
        S += np.outer(phi_k[i], v1[i])                            # key i enters
        if i >= window:
            S -= np.outer(phi_k[i - window], v1[i - window])      # key i - W leaves
        out[i] = phi_q[i] @ S
    return out[:, :-1] / (out[:, -1:] + eps)
