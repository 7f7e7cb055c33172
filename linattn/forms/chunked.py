"""Chunked linear attention: a small masked quadratic inside each block of ``chunk_size``
positions, the running state S of Eq. (10)-(12) between blocks, of Katharopoulos et al.
(2020), arXiv:2006.16236. This is ``method="chunked"``, NumPy's fastest causal form: every
step is a batched matrix product, and Python loops over nothing.

For blocks b of C positions, with Q_b, K_b (C, F), V_b (C, M) and S_b = sum_{c < b} K_c^T V_c:
    out_b = tril(Q_b K_b^T) V_b + Q_b S_b.
Non-causal, every block reads the whole state: out_b = Q_b S_total.
Memory O(N (C + F M / C)): the per-block states (N / C, F, M), never one per position.
Oracle: ``quadratic``.
"""
from .._checks import array_module
from .normaliser import normalised, normalised_backward
from .quadratic import masked

FUSED_FEATURE_MAPS = ()  # every feature map is applied before the kernel
SUPPORTS = frozenset({"non_causal", "key_mask", "initial_state", "return_state"})  # dispatch

DEFAULT_CHUNK_SIZE = 32  # see linear_attention's chunk_size


def _blocks(x, c):
    """(..., N, W) -> (..., B, C, W), zero-padded to B = ceil(N / C) blocks."""
    xp = array_module(x)
    n = x.shape[-2]
    b = -(-n // c)
    pad = [(0, 0)] * (x.ndim - 2) + [(0, b * c - n), (0, 0)]
    return xp.pad(x, pad).reshape(*x.shape[:-2], b, c, x.shape[-1])


def _unblocks(x, n):
    """(..., B, C, W) -> (..., N, W), dropping the padding."""
    rows = x.shape[-3] * x.shape[-2]          # not -1, which is ambiguous when a size is 0
    return x.reshape(*x.shape[:-3], rows, x.shape[-1])[..., :n, :]


def _exclusive_cumsum(x, reverse=False):
    """sum over blocks c < b (or c > b if reverse) along axis -3, without subtracting."""
    xp = array_module(x)
    zero = xp.zeros_like(x[..., :1, :, :])
    if reverse:
        return xp.concatenate([xp.cumsum(x[..., :0:-1, :, :], axis=-3)[..., ::-1, :, :], zero],
                              axis=-3)
    return xp.concatenate([zero, xp.cumsum(x[..., :-1, :, :], axis=-3)], axis=-3)


def product(phi_q, phi_k, v, causal, chunk_size):
    """out_i = phi_q_i^T sum_{j <= i} phi_k_j v_j^T (all j if not causal), block by block.

    Shapes: phi_q (..., Nq, F), phi_k (..., Nk, F), v (..., Nk, M) -> out (..., Nq, M);
    Nq == Nk when causal.
    """
    n = phi_q.shape[-2]
    q, k, vb = (_blocks(x, chunk_size) for x in (phi_q, phi_k, v))  # (..., B, C, F|M)
    kv = k.swapaxes(-1, -2) @ vb                        # (..., B, F, M): each block's K_b^T V_b
    if not causal:
        return _unblocks(q @ kv.sum(axis=-3, keepdims=True), n)
    s = _exclusive_cumsum(kv)                           # S_b, the state entering block b
    intra = masked(q @ k.swapaxes(-1, -2), True) @ vb    # (..., B, C, M)
    return _unblocks(intra + q @ s, n)


def product_backward(dout, phi_q, phi_k, v, causal, chunk_size):
    """Backward of ``product``: (dphi_q, dphi_k, dv), Eq. (13)-(15) block by block.

    With G_b = sum_{c > b} Q_c^T dout_c (the gradient of the state leaving block b) and
    A_b = tril(Q_b K_b^T), dA_b = tril(dout_b V_b^T):
    dQ_b = dA_b K_b + dout_b S_b^T, dK_b = dA_b^T Q_b + V_b G_b^T, dV_b = A_b^T dout_b + K_b G_b.
    """
    n_q, n_k = phi_q.shape[-2], phi_k.shape[-2]
    q, k, vb, do = (_blocks(x, chunk_size) for x in (phi_q, phi_k, v, dout))
    kv = k.swapaxes(-1, -2) @ vb                        # (..., B, F, M)
    qdo = q.swapaxes(-1, -2) @ do                       # (..., B, F, M)
    if not causal:
        s, g = kv.sum(axis=-3, keepdims=True), qdo.sum(axis=-3, keepdims=True)
        dq, dk, dv = do @ s.swapaxes(-1, -2), vb @ g.swapaxes(-1, -2), k @ g
    else:
        s, g = _exclusive_cumsum(kv), _exclusive_cumsum(qdo, reverse=True)
        a = masked(q @ k.swapaxes(-1, -2), True)         # (..., B, C, C)
        da = masked(do @ vb.swapaxes(-1, -2), True)
        dq = da @ k + do @ s.swapaxes(-1, -2)
        dk = da.swapaxes(-1, -2) @ q + vb @ g.swapaxes(-1, -2)
        dv = a.swapaxes(-1, -2) @ do + k @ g
    return _unblocks(dq, n_q), _unblocks(dk, n_k), _unblocks(dv, n_k)


def attend(phi_q, phi_k, v, *, causal, eps, chunk_size=DEFAULT_CHUNK_SIZE, key_mask=None,
           initial_state=None, return_state=False):
    """Normalised linear attention, Eq. (5) / (9), in blocks of ``chunk_size`` positions; the
    key mask and states as in ``padding`` (with the state: ``(out, State)``).

    Shapes (..., Nq, F), (..., Nk, F), (..., Nk, M) -> (..., Nq, M).
    Cost: O(N C (F + M) + N F M) time.
    """
    return normalised(product, phi_q, phi_k, v, eps, causal=causal, chunk_size=chunk_size,
                      key_mask=key_mask, initial_state=initial_state, return_state=return_state)


def attend_backward(dout, phi_q, phi_k, v, *, causal, eps, chunk_size=DEFAULT_CHUNK_SIZE,
                    key_mask=None, initial_state=None, dstate=None):
    """Backward of ``attend``: (dphi_q, dphi_k, dv), and the initial state's gradient when
    one is given."""
    return normalised_backward(product, product_backward, dout, phi_q, phi_k, v, eps,
                               causal=causal, chunk_size=chunk_size, key_mask=key_mask,
                               initial_state=initial_state, dstate=dstate)
