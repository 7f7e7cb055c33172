"""Our answers to the exercises of notebook 04 (transformers are RNNs). The checks are in
``checks/04_transformers_are_rnns.py``; try the exercises before reading on."""
import numpy as np

import linattn


# ---- Exercise 1: the state after a prompt, without stepping ---------------------------------

def prefill_state(k, v):
    """The state after positions 1..N, Eq. (18)-(19) unrolled: s_N = sum_j phi(k_j) v_j^T =
    phi(K)^T V and z_N = sum_j phi(k_j), the sums of the non-causal form (notebook 02)."""
    phi_k = linattn.EluPlusOne().forward(k)                          # (..., N, F)
    return linattn.State(np.swapaxes(phi_k, -1, -2) @ v, phi_k.sum(axis=-2))


# ---- Exercise 2: a state that forgets ------------------------------------------------------

def decayed_step(q_i, k_i, v_i, S, z, gamma, eps=1e-6):
    """s_i = gamma s_{i-1} + phi(k_i) v_i^T, z_i = gamma z_{i-1} + phi(k_i), then Eq. (20)."""
    phi = linattn.EluPlusOne()
    phi_q, phi_k = phi.forward(q_i), phi.forward(k_i)
    S = gamma * S + phi_k[..., :, None] * v_i[..., None, :]
    z = gamma * z + phi_k
    out = np.einsum("...f,...fm->...m", phi_q, S) / (np.einsum("...f,...f->...", phi_q, z)
                                                      + eps)[..., None]
    return out, S, z


def decayed_attention_parallel(q, k, v, gamma, eps=1e-6):
    """Unrolled, s_i = sum_{j <= i} gamma^(i - j) phi(k_j) v_j^T: the causal matrix A with
    entry (i, j) weighted by gamma^(i - j)."""
    phi = linattn.EluPlusOne()
    n = q.shape[0]
    i, j = np.indices((n, n))
    weights = np.where(j <= i, gamma ** np.maximum(i - j, 0), 0.0)
    a = (phi.forward(q) @ phi.forward(k).T) * weights
    return (a @ v) / (a.sum(axis=1, keepdims=True) + eps)
