"""The delta rule in chunks, compiled: ``method="chunked"``, ``backend="numba"`` of
``linattn.delta_rule_attention``, the WY (UT) representation of Yang et al. 2024,
"Parallelizing Linear Transformers with the Delta Rule over Sequence Length",
arXiv:2406.06484, section 3. Oracle: ``forms.delta_chunked``, whose derivation and gradient
equations these loops follow term for term (and ``forms.delta``, the scan).

In a chunk of C positions, rows K, Q (C, F), V (C, M), strengths beta, entered with the
memory S (F, M):

    A = I + tril(diag(beta) K K^T, -1),   [U | W] = A^{-1} diag(beta) [V | K]
    Wr = U - W S,   out = Q S + tril(Q K^T) Wr,   S <- S + K^T Wr

[U | W] by forward substitution in loops; the products with S, and the C x C ones, by BLAS
(``blas.gemm``, each added into the array that holds its sum). One row (batch x heads
flattened) per ``prange`` iteration, its chunks in order; a row's last chunk is shorter when
C does not divide N (no padding). The backward runs the chunks forward once, keeping U, W
(N (F + M)) and the memory entering each chunk ((N / C) F M), then walks them in reverse
with G = dL/dS. No fastmath; float32 stays float32.

Memory per row: O(N (F + M) + (N / C) F M + C^2) in the backward, O(C (C + F + M) + F M)
in the forward; never N x N, and a memory per chunk, not per position (unless C = 1).
"""
import math

import numpy as np
from numba import njit, prange

from .blas import gemm
from .block_ops import masked
from .delta import step  # noqa: F401  one position is the same in both forms (dispatch)
from .._checks import rows
from ..forms.delta_chunked import DEFAULT_CHUNK_SIZE

FUSED_FEATURE_MAPS = ()                     # features are computed before the kernel
SUPPORTS = frozenset({"initial_state", "return_state"})  # dispatch; always causal


@njit(cache=True, error_model="numpy")
def _solve(K, V, beta, U, W):
    """[U | W] = T [V | K] with T = A^{-1} diag(beta): the rows X_i = beta_i [V_i | K_i]
    - sum_{j<i} beta_i (k_i . k_j) X_j, by forward substitution; returns K K^T (C, C)."""
    KK = np.empty((K.shape[0], K.shape[0]), dtype=K.dtype)
    gemm(K, K.T, KK, 0)
    for i in range(K.shape[0]):
        for m in range(V.shape[1]):
            U[i, m] = beta[i] * V[i, m]                   # diag(beta) V
        for f in range(K.shape[1]):
            W[i, f] = beta[i] * K[i, f]                   # diag(beta) K
        for j in range(i):
            L = beta[i] * KK[i, j]                       # L_ij, strictly lower
            for m in range(V.shape[1]):
                U[i, m] -= L * U[j, m]
            for f in range(K.shape[1]):
                W[i, f] -= L * W[j, f]
    return KK


@njit(cache=True, error_model="numpy")
def _written(U, W, S, Wr):
    """Wr = U - W S (C, M): the rows the chunk writes into the memory S entering it."""
    gemm(W, S, Wr, 0)
    for i in range(Wr.shape[0]):
        for m in range(Wr.shape[1]):
            Wr[i, m] = U[i, m] - Wr[i, m]


@njit(parallel=True, cache=True, error_model="numpy")
def _forward(q, k, v, beta, S, out, c):
    """Every row r from S[r] (updated in place to S_N): out[r] (N, M) chunk by chunk.
    Shapes q, k (R, N, F), v, out (R, N, M), beta (R, N), S (R, F, M)."""
    n, f_width, m_width = q.shape[1], q.shape[2], v.shape[2]
    for r in prange(q.shape[0]):
        U, W = np.empty((c, m_width), dtype=v.dtype), np.empty((c, f_width), dtype=v.dtype)
        Wr = np.empty((c, m_width), dtype=v.dtype)
        for i0 in range(0, n, c):
            i1 = min(n, i0 + c)
            w = i1 - i0
            Q, K, out_b = q[r, i0:i1], k[r, i0:i1], out[r, i0:i1]
            _solve(K, v[r, i0:i1], beta[r, i0:i1], U[:w], W[:w])
            _written(U[:w], W[:w], S[r], Wr[:w])                  # Wr = U - W S
            gemm(Q, S[r], out_b, 0)                               # Q S: earlier chunks
            gemm(masked(Q, K, False), Wr[:w], out_b, 1)           # + tril(Q K^T) Wr
            gemm(K.T, Wr[:w], S[r], 1)                            # S <- S + K^T Wr


@njit(cache=True, error_model="numpy")
def _chunk_backward(Q, K, V, beta, dout_b, U, W, S, G, dq_b, dk_b, dv_b, dbeta_b):
    """One chunk backward, S the memory entering it and G = dL/dS leaving it (updated in
    place to dL/dS entering it); writes the chunk's dq, dk, dv, dbeta. Equations:
    ``forms.delta_chunked.attend_backward``."""
    w, f_width, m_width = Q.shape[0], Q.shape[1], U.shape[1]
    dtype = U.dtype
    Wr = np.empty((w, m_width), dtype=dtype)
    _written(U, W, S, Wr)                                         # Wr = U - W S
    dWr = np.empty((w, m_width), dtype=dtype)                     # dWr = P^T dout + K G
    gemm(masked(Q, K, False).T, dout_b, dWr, 0)
    gemm(K, G, dWr, 1)
    dP = masked(dout_b, Wr, False)                                # tril(dout Wr^T)
    gemm(dout_b, S.T, dq_b, 0)                                    # dQ = dout S^T + dP K
    gemm(dP, K, dq_b, 1)
    gemm(dP.T, Q, dk_b, 0)                                        # dK = dP^T Q + Wr G^T
    gemm(Wr, G.T, dk_b, 1)
    dW = np.empty((w, f_width), dtype=dtype)                      # dW = -dWr S^T; dU = dWr
    gemm(dWr, S.T, dW, 0)
    WdWr = np.empty((f_width, m_width), dtype=dtype)
    gemm(W.T, dWr, WdWr, 0)
    gemm(Q.T, dout_b, G, 1)                                       # G += Q^T dout - W^T dWr
    for f in range(f_width):
        for m in range(m_width):
            G[f, m] -= WdWr[f, m]
    # back through [U | W] = A^{-1} diag(beta) [V | K]: dB = A^{-T} [dU | dW], rows from the
    # last, dB_i = dX_i - sum_{j>i} L_ji dB_j (dBU = dB_V in place of dWr, dBW = dB_K)
    KK = np.empty((w, w), dtype=dtype)                            # K K^T, again
    gemm(K, K.T, KK, 0)
    dBU, dBW = dWr, dW
    for i in range(w):
        for f in range(f_width):
            dBW[i, f] = -dBW[i, f]                                # dW's sign
    for i in range(w - 1, -1, -1):
        for j in range(i + 1, w):
            L = beta[j] * KK[j, i]                                # L_ji
            for m in range(m_width):
                dBU[i, m] -= L * dBU[j, m]
            for f in range(f_width):
                dBW[i, f] -= L * dBW[j, f]
    dA = np.empty((w, w), dtype=dtype)                            # -dB X^T, strictly lower
    gemm(dBU, U.T, dA, 0)
    gemm(dBW, W.T, dA, 1)
    E = np.zeros((w, w), dtype=dtype)                             # E = diag(beta) dA
    for i in range(w):
        db = U.dtype.type(0)
        for m in range(m_width):
            dv_b[i, m] = beta[i] * dBU[i, m]                      # dV = diag(beta) dB_V
            db += dBU[i, m] * V[i, m]
        for f in range(f_width):
            dk_b[i, f] += beta[i] * dBW[i, f]                     # dK += diag(beta) dB_K
            db += dBW[i, f] * K[i, f]
        for j in range(i):
            dA[i, j] = -dA[i, j]
            db += dA[i, j] * KK[i, j]                             # rowsum(dA * K K^T)
            E[i, j] = beta[i] * dA[i, j]
        dbeta_b[i] = db
    gemm(E, K, dk_b, 1)                                           # dK += E K + E^T K
    gemm(E.T, K, dk_b, 1)


@njit(parallel=True, cache=True, error_model="numpy")
def _backward(dout, q, k, v, beta, S0, G, dq, dk, dv, dbeta, c):
    """Every row r: G[r] (dL/dS_N on entry) ends as dL/dS_0; dq, dk, dv, dbeta written.
    The chunks forward once (U, W and the memory entering each kept), then in reverse."""
    n, f_width, m_width = q.shape[1], q.shape[2], v.shape[2]
    n_chunks = (n + c - 1) // c
    for r in prange(q.shape[0]):
        U, W = np.empty((n, m_width), dtype=v.dtype), np.empty((n, f_width), dtype=v.dtype)
        entering = np.empty((n_chunks, f_width, m_width), dtype=v.dtype)  # (N / C, F, M)
        Wr = np.empty((c, m_width), dtype=v.dtype)
        S = S0[r].copy()
        for b in range(n_chunks):                                 # forward: the memories
            i0, i1 = b * c, min(n, b * c + c)
            w = i1 - i0
            entering[b] = S
            _solve(k[r, i0:i1], v[r, i0:i1], beta[r, i0:i1], U[i0:i1], W[i0:i1])
            _written(U[i0:i1], W[i0:i1], S, Wr[:w])
            gemm(k[r, i0:i1].T, Wr[:w], S, 1)                     # S <- S + K^T Wr
        for b in range(n_chunks - 1, -1, -1):
            i0, i1 = b * c, min(n, b * c + c)
            _chunk_backward(q[r, i0:i1], k[r, i0:i1], v[r, i0:i1], beta[r, i0:i1],
                            dout[r, i0:i1], U[i0:i1], W[i0:i1], entering[b], G[r],
                            dq[r, i0:i1], dk[r, i0:i1], dv[r, i0:i1], dbeta[r, i0:i1])


def _start(q, v, state):
    """S (R, F, M), C-contiguous, a copy: zero, or ``state`` (..., F, M) in v's dtype."""
    shape = (math.prod(q.shape[:-2]), q.shape[-1], v.shape[-1])
    if state is None:
        return np.zeros(shape, dtype=v.dtype)
    return np.array(state, dtype=v.dtype, order="C").reshape(shape)


def attend(q, k, v, beta, *, chunk_size=DEFAULT_CHUNK_SIZE, initial_state=None,
           return_state=False):
    """As ``forms.delta_chunked.attend``: out (..., N, M), and S_N (..., F, M) with
    ``return_state``.

    Cost: O(N C (F + M) + N F M) time; O(C (C + F + M) + F M) memory per row beyond the
    output and the final memory.
    """
    c = chunk_size or DEFAULT_CHUNK_SIZE
    S = _start(q, v, initial_state)
    out = np.empty((*q.shape[:-1], v.shape[-1]), dtype=v.dtype)
    _forward(rows(q), rows(k), rows(v), rows(beta[..., None])[..., 0], S,
             out.reshape(S.shape[0], *out.shape[-2:]), c)      # a view, written
    S = S.reshape(*v.shape[:-2], *S.shape[-2:])
    return (out, S) if return_state else out


def attend_backward(dout, q, k, v, beta, *, chunk_size=DEFAULT_CHUNK_SIZE, initial_state=None,
                    dstate=None):
    """As ``forms.delta_chunked.attend_backward``: (dq, dk, dv, dbeta), and dS_0 when
    ``initial_state`` is given.

    Cost: about three forwards' time; memory per row O(N (F + M) + (N / C) F M) for U, W
    and the memory entering each chunk, beyond the gradients.
    """
    c = chunk_size or DEFAULT_CHUNK_SIZE
    G = _start(q, v, dstate)                                      # dL/dS_N, then dS_0
    dq, dk = np.empty(q.shape, v.dtype), np.empty(k.shape, v.dtype)
    dv, dbeta = np.empty(v.shape, v.dtype), np.empty(beta.shape, v.dtype)
    r, n = G.shape[0], q.shape[-2]
    _backward(rows(dout), rows(q), rows(k), rows(v), rows(beta[..., None])[..., 0],
              _start(q, v, initial_state), G, dq.reshape(r, *q.shape[-2:]),
              dk.reshape(r, *k.shape[-2:]), dv.reshape(r, *v.shape[-2:]),
              dbeta.reshape(r, n), c)
    grads = (dq, dk, dv, dbeta)
    dS0 = G.reshape(*v.shape[:-2], *G.shape[-2:])
    return grads if initial_state is None else (*grads, dS0)
