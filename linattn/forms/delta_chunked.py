"""The delta rule in chunks, through the WY (UT) representation: ``method="chunked"`` of
``linattn.delta_rule_attention`` (Yang et al. 2024, "Parallelizing Linear Transformers with
the Delta Rule over Sequence Length", arXiv:2406.06484, section 3, after the WY form of
products of Householder-like matrices, Bischof and Van Loan 1987).

Derivation. In a chunk of C positions, rows K (C, F), Q (C, F), V (C, M), strengths beta (C),
entered with the memory S (F, M), the recurrence of ``forms.delta`` writes the rows
w_t = beta_t u_t = beta_t (v_t - S_{t-1}^T k_t), and S_{t-1} = S + sum_{s<t} k_s w_s^T, so

    w_t + beta_t sum_{s<t} (k_t . k_s) w_s = beta_t (v_t - S^T k_t),

that is A Wr = diag(beta) (V - K S) with A = I + tril(diag(beta) K K^T, -1), unit lower
triangular. With T = A^{-1} diag(beta), U = T V and W = T K (both by forward substitution,
independent of S, so every chunk's are computed at once):

    Wr = U - W S                                      the rows written, (C, M)
    out = Q S + tril(Q K^T) Wr                        out_t = S_t^T q_t, diagonal included
    S_next = S + K^T Wr = S + K^T (U - W S)           the memory leaving the chunk

Only the last two products carry S from chunk to chunk; everything else is C x C or C x F
per chunk. Oracle: ``forms.delta`` (the scan of ``step``).

Memory: the forward keeps U, W (N (F + M)), one C x C matrix per chunk and the (F, M) memory,
never an N x N or N x F x M array; the backward also stores the memory entering each chunk,
(N / C) F M. Cost O(N C (F + M) + N F M) time.
"""
import numpy as np

from .chunked import _blocks, _unblocks
from .delta import step  # noqa: F401  one position is the same in both forms (dispatch)

FUSED_FEATURE_MAPS = ()                     # features are computed before the kernel
SUPPORTS = frozenset({"initial_state", "return_state"})  # dispatch; always causal

DEFAULT_CHUNK_SIZE = 32


def _strict_lower(x):
    """tril(x, -1) over the last two axes."""
    return np.tril(x, -1)


def _forward_substitution(L, B):
    """X with (I + L) X = B, L strictly lower triangular (..., C, C), B (..., C, W)."""
    X = np.empty_like(B)
    for i in range(B.shape[-2]):                # X_i = B_i - sum_{j<i} L_ij X_j
        X[..., i, :] = B[..., i, :] - (L[..., i:i + 1, :i] @ X[..., :i, :])[..., 0, :]
    return X


def _back_substitution(L, Y):
    """X with (I + L)^T X = Y, L strictly lower triangular (..., C, C), Y (..., C, W)."""
    X = np.empty_like(Y)
    c = Y.shape[-2]
    for i in reversed(range(c)):                # X_i = Y_i - sum_{j>i} L_ji X_j
        X[..., i, :] = Y[..., i, :] - (L[..., i + 1:, i][..., None, :]
                                       @ X[..., i + 1:, :])[..., 0, :]
    return X


def _chunks(q, k, v, beta, c):
    """Blocks (..., B, C, .) of q, k, v, beta (zero-padded: a padded row has beta = 0 and
    k = 0, so it writes nothing), L = tril(diag(beta) K K^T, -1), and [U | W] = T [V | K]."""
    qb, kb, vb = (_blocks(x, c) for x in (q, k, v))
    bb = _blocks(beta[..., None], c)                          # (..., B, C, 1)
    L = _strict_lower(bb * (kb @ kb.swapaxes(-1, -2)))        # (..., B, C, C)
    UW = _forward_substitution(L, bb * np.concatenate([vb, kb], axis=-1))  # T [V | K]
    m = v.shape[-1]
    return qb, kb, vb, bb, L, UW, UW[..., :m], UW[..., m:]


def attend(q, k, v, beta, *, chunk_size=DEFAULT_CHUNK_SIZE, initial_state=None,
           return_state=False):
    """The delta rule chunk by chunk: out (..., N, M), and S_N (..., F, M) with
    ``return_state``; arguments as ``forms.delta.attend``.

    Cost: O(N C (F + M) + N F M) time; O(N (C + F + M) + F M) memory.
    """
    n, c = q.shape[-2], chunk_size or DEFAULT_CHUNK_SIZE
    qb, kb, _, _, _, _, U, W = _chunks(q, k, v, beta, c)
    P = np.tril(qb @ kb.swapaxes(-1, -2))                     # tril(Q K^T), (..., B, C, C)
    S = (np.zeros((*v.shape[:-2], q.shape[-1], v.shape[-1]), dtype=v.dtype)
         if initial_state is None else initial_state)
    out = np.empty((*qb.shape[:-1], v.shape[-1]), dtype=v.dtype)  # (..., B, C, M)
    for b in range(qb.shape[-3]):
        Wr = U[..., b, :, :] - W[..., b, :, :] @ S             # rows written, (..., C, M)
        out[..., b, :, :] = qb[..., b, :, :] @ S + P[..., b, :, :] @ Wr
        S = S + kb[..., b, :, :].swapaxes(-1, -2) @ Wr         # S_next = S + K^T Wr
    out = _unblocks(out, n)
    return (out, S) if return_state else out


def attend_backward(dout, q, k, v, beta, *, chunk_size=DEFAULT_CHUNK_SIZE, initial_state=None,
                    dstate=None):
    """Backward of ``attend``: (dq, dk, dv, dbeta), and dS_0 when ``initial_state`` is given.

    Per chunk, in reverse, with G = dL/dS_next (from ``dstate``, or 0) and S the stored
    memory entering it:

        dWr = P^T dout + K G                              (out and S_next through Wr)
        dQ = dout S^T + tril(dout Wr^T) K,   dK = tril(dout Wr^T)^T Q + Wr G^T
        dU = dWr,  dW = -dWr S^T,            G <- G + Q^T dout - W^T dWr  (dL/dS)

    then, for all chunks at once, back through X = [U | W] = A^{-1} diag(beta) [V | K]:
    dB = A^{-T} dX (back substitution), dA = -dB X^T on its strict lower part, and with
    B = diag(beta) [V | K] and A = I + tril(diag(beta) K K^T, -1):

        dV += diag(beta) dB_V,  dK += diag(beta) dB_K + E K + E^T K,  E = diag(beta) dA,
        dbeta = rowsum(dB_V * V + dB_K * K) + rowsum(dA * K K^T).

    Memory: as ``attend``, plus the memory entering each chunk, (N / C) F M.
    """
    n, c, m = q.shape[-2], chunk_size or DEFAULT_CHUNK_SIZE, v.shape[-1]
    qb, kb, vb, bb, L, UW, U, W = _chunks(q, k, v, beta, c)
    P = np.tril(qb @ kb.swapaxes(-1, -2))                     # (..., B, C, C)
    do = _blocks(dout, c)
    S = (np.zeros((*v.shape[:-2], q.shape[-1], m), dtype=v.dtype)
         if initial_state is None else initial_state)
    entering = np.empty((*qb.shape[:-2], q.shape[-1], m), dtype=v.dtype)  # (..., B, F, M)
    for b in range(qb.shape[-3]):                             # forward: the memories
        entering[..., b, :, :] = S
        S = S + kb[..., b, :, :].swapaxes(-1, -2) @ (U[..., b, :, :] - W[..., b, :, :] @ S)
    G = np.zeros_like(S) if dstate is None else dstate.astype(S.dtype, copy=True)
    dq, dk = np.empty_like(qb), np.empty_like(kb)
    dUW = np.empty_like(UW)
    for b in reversed(range(qb.shape[-3])):
        S = entering[..., b, :, :]
        Q, K, Wc, do_b, P_b = (x[..., b, :, :] for x in (qb, kb, W, do, P))
        Wr = U[..., b, :, :] - Wc @ S                            # (..., C, M)
        dWr = P_b.swapaxes(-1, -2) @ do_b + K @ G                # (..., C, M)
        dP = np.tril(do_b @ Wr.swapaxes(-1, -2))                 # (..., C, C)
        dq[..., b, :, :] = do_b @ S.swapaxes(-1, -2) + dP @ K
        dk[..., b, :, :] = dP.swapaxes(-1, -2) @ Q + Wr @ G.swapaxes(-1, -2)
        dUW[..., b, :, :m] = dWr                                 # dU
        dUW[..., b, :, m:] = -dWr @ S.swapaxes(-1, -2)           # dW
        G = G + Q.swapaxes(-1, -2) @ do_b - Wc.swapaxes(-1, -2) @ dWr  # dL/dS entering
    dB = _back_substitution(L, dUW)                             # A^{-T} dX, (..., B, C, M+F)
    dA = _strict_lower(-dB @ UW.swapaxes(-1, -2))               # (..., B, C, C)
    kk = kb @ kb.swapaxes(-1, -2)
    E = bb * dA                                                 # d(K K^T) on the strict part
    dv = bb * dB[..., :m]
    dk = dk + bb * dB[..., m:] + E @ kb + E.swapaxes(-1, -2) @ kb
    dbeta = ((dB[..., :m] * vb).sum(-1) + (dB[..., m:] * kb).sum(-1)
             + (dA * kk).sum(-1))                               # (..., B, C)
    dbeta = _unblocks(dbeta[..., None], n)[..., 0]
    grads = (_unblocks(dq, n), _unblocks(dk, n), _unblocks(dv, n), dbeta)
    return grads if initial_state is None else (*grads, G)
