"""Our answers to the exercises of notebook 05 (gradients by hand). The checks are in
``checks/05_gradients_by_hand.py``; try the exercises before reading on."""
import numpy as np

import linattn


# ---- Exercise 1: relu's backward, and a query that gets no gradient -------------------------

def relu_vjp(x, dphi):
    """dx for phi(x) = max(x, 0): dphi where x > 0, 0 elsewhere."""
    return dphi * (x > 0)


def dead_query_prediction():
    """A query with every coordinate < 0 has phi(q) = 0: numerator 0 and normaliser eps, so
    its output row is 0; dphi(q) is finite (large: divided by eps), but relu's derivative is
    0 at every coordinate, so dq = 0. Nothing will move it out of the dead region."""
    return 0.0, 0.0


# ---- Exercise 2: the softmax backward in tiles of keys --------------------------------------

def softmax_attention_backward_tiled(dout, q, k, v, tile):
    """(dq, dk, dv) of non-causal softmax attention, recomputing P one (Nq, tile) block at a
    time from each row's log-sum-exp, as FlashAttention-2 does:
    pass 1: lse_i = log sum_j exp(L_ij), over the tiles with a running maximum;
    pass 2: out = sum over tiles of P V, then delta_i = dout_i . out_i (= sum_j P_ij dP_ij);
    pass 3: per tile P = exp(L - lse), dV_c = P^T dout, dL = P (dout V_c^T - delta),
    dQ += dL K_c / sqrt(D), dK_c = dL^T Q / sqrt(D)."""
    scale = q.shape[-1] ** -0.5
    n_k = k.shape[0]
    blocks = [slice(s, s + tile) for s in range(0, n_k, tile)]
    m = np.full(q.shape[0], -np.inf)
    l = np.zeros(q.shape[0])
    for b in blocks:                                             # pass 1: lse
        logits = q @ k[b].T * scale
        m_new = np.maximum(m, logits.max(axis=1))
        l = l * np.exp(m - m_new) + np.exp(logits - m_new[:, None]).sum(axis=1)
        m = m_new
    lse = m + np.log(l)
    out = sum(np.exp(q @ k[b].T * scale - lse[:, None]) @ v[b] for b in blocks)   # pass 2
    delta = (dout * out).sum(axis=1)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b in blocks:                                             # pass 3
        p = np.exp(q @ k[b].T * scale - lse[:, None])            # (Nq, tile)
        dv[b] = p.T @ dout
        dl = p * (dout @ v[b].T - delta[:, None])
        dq += dl @ k[b] * scale
        dk[b] = dl.T @ q * scale
    return dq, dk, dv


# ---- Exercise 3: the non-causal linear attention backward -----------------------------------

def linear_attention_backward_noncausal(dout, q, k, v, eps=1e-6):
    """(dq, dk, dv) of non-causal linear attention with elu+1, Eq. (5)."""
    phi = linattn.EluPlusOne()
    phi_q, phi_k = phi.forward(q), phi.forward(k)
    s, z = phi_k.T @ v, phi_k.sum(axis=0)             # (F, M), (F,)
    den = phi_q @ z + eps                              # (N,)
    out = (phi_q @ s) / den[:, None]
    dnum = dout / den[:, None]                         # through num / den
    dden = -(dout * out).sum(axis=1) / den
    dphi_q = dnum @ s.T + dden[:, None] * z
    ds, dz = phi_q.T @ dnum, phi_q.T @ dden            # (F, M), (F,)
    dphi_k = v @ ds.T + dz
    return phi.vjp(q, dphi_q), phi.vjp(k, dphi_k), phi_k @ ds
