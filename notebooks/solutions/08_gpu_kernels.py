"""Our answers to notebook 08's exercises, the chunked scan (the checks are in
``checks/08_gpu_kernels.py``). The causal numerator is num_i = phi(q_i)^T S_i with
S_i = sum_{j <= i} phi(k_j) v_j^T, Eq. (10) of Katharopoulos et al. (2020),
arXiv:2006.16236; its gradients are Eq. (13)-(15).

1. ``reverse_exclusive_scan``: G_c = sum over later chunks c' > c, step 2 of the backward.
2. ``chunked_dq``: d phi(Q) = dout S^T, chunk by chunk: the state entering each chunk (the
   forward exclusive scan) plus the chunk's own masked block.
3. ``chunked_dv``: dV, chunk by chunk: the masked block A_c^T dout_c plus phi(K_c) G_c.
"""
import numpy as np


def reverse_exclusive_scan(x):
    """Exercise 1: out[:, c] = sum_{c' > c} x[:, c'] for x (H, NC, ...)."""
    out = np.zeros_like(x)
    for c in range(x.shape[1] - 2, -1, -1):            # the backward pass walks right to left
        out[:, c] = out[:, c + 1] + x[:, c + 1]
    return out


def chunked_dq(dout, phi_k, v, chunk_size):
    """Exercise 2: d phi(q_i) = S_i dout_i, shapes (N, M), (N, F), (N, M) -> (N, F).

    For the rows of chunk c: dout_c S_c^T (the state entering the chunk) plus
    tril(dout_c V_c^T) phi(K_c) (the chunk's own positions j <= i).
    """
    n = dout.shape[0]
    dq = np.empty((n, phi_k.shape[1]))
    state = np.zeros((phi_k.shape[1], v.shape[1]))      # S_c, the exclusive prefix
    for s in range(0, n, chunk_size):
        b = slice(s, s + chunk_size)
        dq[b] = dout[b] @ state.T + np.tril(dout[b] @ v[b].T) @ phi_k[b]
        state = state + phi_k[b].T @ v[b]
    return dq


def chunked_dv(dout, phi_q, phi_k, chunk_size):
    """Exercise 3: dV of out = tril(phi_q phi_k^T) v, chunk by chunk, shapes (N, F), (N, M).

    dV_j = sum_{i >= j} (phi_q_i . phi_k_j) dout_i: within chunk c the masked block
    A_c^T dout_c, from later chunks phi_k_c G_c with G_c = sum_{c' > c} phi_q_c'^T dout_c'.
    """
    n = dout.shape[0]
    starts = range(0, n, chunk_size)
    parts = np.stack([phi_q[s:s + chunk_size].T @ dout[s:s + chunk_size] for s in starts])
    later = reverse_exclusive_scan(parts[None])[0]      # G_c, (NC, F, M)
    dv = np.empty_like(dout)
    for c, s in enumerate(starts):
        b = slice(s, s + chunk_size)
        a = np.tril(phi_q[b] @ phi_k[b].T)               # (C, C): j <= i in the chunk
        dv[b] = a.T @ dout[b] + phi_k[b] @ later[c]
    return dv
