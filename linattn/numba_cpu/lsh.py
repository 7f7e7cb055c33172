"""Reformer (LSH) attention (Kitaev et al., 2020, arXiv:2001.04451), the second baseline of
Katharopoulos et al. (2020), arXiv:2006.16236: compiled chunk loops, forward and backward.

The hashing and sorting are NumPy's (``forms.lsh.hashing``); the kernels take each round's
sorted order and work one chunk at a time, its queries against its window (the chunk and
the one before it, 2 C keys): gather the rows, one BLAS product for the logits
(``blas.gemm``), mask and correct them in a loop, one product for the values. Rounds are
combined online, as flash attention combines blocks: each query keeps its largest logit so
far m_i, its sum of exps s_i and its unnormalised output a_i; a round with maximum m' gives
m_new = max(m_i, m'), s_i <- e^{m_i - m_new} s_i + sum_j e^{l_ij - m_new}, and a_i likewise;
at the end out_i = a_i / s_i and lse_i = m_i + log s_i. That is the reference's
sum_r exp(lse_r - logsumexp lse) out_r without storing the rounds.

Parallel over (batch x heads) x chunks, one round after another. In a round every query
belongs to one chunk, so forward units never write the same row. The backward writes key
gradients to the chunk's own keys and to the previous chunk's, so it runs the even chunks,
then the odd ones: units of one parity touch disjoint keys. Memory O(N (D + M)) plus
O(C (C + D + M)) per unit; time O(N C (D + M + n_hashes)) per round.
Oracle: ``forms.lsh`` (NumPy). Same signatures: already validated arrays.
"""
import math

import numpy as np
from numba import njit, prange

from ..forms import lsh
from .blas import gemm


def _rows(x):
    """(..., N, W) -> (R, N, W), C-contiguous."""
    return np.ascontiguousarray(x.reshape(math.prod(x.shape[:-2]), *x.shape[-2:]))


def _prepare(qk, *, n_hashes, chunk_size, n_buckets, causal, seed):
    """Unit keys, norms and the hashing, as rows: (qk, k, norm, order, chunk, has_other)."""
    k, norm = lsh.unit_keys(qk)
    hashes = lsh.hashing(k, n_hashes=n_hashes, chunk_size=chunk_size, n_buckets=n_buckets,
                         causal=causal, seed=seed)
    n = qk.shape[-2]
    order = np.ascontiguousarray(hashes.order.reshape(n_hashes, -1, n))          # (H, R, N)
    chunk = np.ascontiguousarray(hashes.rank.reshape(n_hashes, -1, n) // chunk_size)
    return _rows(qk), _rows(k), norm, order, chunk, hashes.has_other.reshape(-1, n)


def _forward(qk, k, v, order, chunk, has_other, c, causal):
    """(out (R, N, M), lse (R, N)) over all rounds."""
    rows, n, _ = qk.shape
    dtype = v.dtype.type
    top = np.full((rows, n), -np.inf, dtype=v.dtype)                # m_i
    total = np.zeros((rows, n), dtype=v.dtype)                      # s_i
    acc = np.zeros(v.shape, dtype=v.dtype)                          # a_i
    log_meets = np.log(np.arange(1, len(order) + 1)).astype(v.dtype)
    for r in range(len(order)):
        _forward_round(qk, k, v, order[r], chunk, has_other, c, causal,
                       dtype(qk.shape[-1] ** -0.5), log_meets, top, total, acc)
    return acc / total[..., None], top + np.log(total)     # s_i > 0: every query sees a key


def attend(qk, v, *, n_hashes, chunk_size, n_buckets, causal, seed):
    """LSH attention, the ``forms.lsh.attend`` semantics. qk (..., N, D), v (..., N, M) ->
    out (..., N, M). Cost O(n_hashes N (D n_buckets + log N + C (D + M + n_hashes)))."""
    if qk.shape[-2] == 0:
        return np.zeros(v.shape, dtype=v.dtype)
    qk_r, k_r, _, order, chunk, has_other = _prepare(
        qk, n_hashes=n_hashes, chunk_size=chunk_size, n_buckets=n_buckets, causal=causal,
        seed=seed)
    out, _ = _forward(qk_r, k_r, _rows(v), order, chunk, has_other, chunk_size, causal)
    return out.reshape(v.shape)


def attend_backward(dout, qk, v, *, n_hashes, chunk_size, n_buckets, causal, seed):
    """(dqk, dv) of ``attend``, the equations of ``forms.lsh.attend_backward``: the forward
    once for lse and out, then per round dv += P^T dout, dl = P (dout v^T - dout . out) /
    sqrt(D), dq += dl k, dk += dl^T qk, and dqk = dq + (dk - k (k . dk)) / ||qk||."""
    if qk.shape[-2] == 0:
        return np.zeros(qk.shape, dtype=qk.dtype), np.zeros(v.shape, dtype=v.dtype)
    qk_r, k_r, norm, order, chunk, has_other = _prepare(
        qk, n_hashes=n_hashes, chunk_size=chunk_size, n_buckets=n_buckets, causal=causal,
        seed=seed)
    v_r, dout_r = _rows(v), _rows(dout)
    out, lse = _forward(qk_r, k_r, v_r, order, chunk, has_other, chunk_size, causal)
    delta = np.sum(dout_r * out, axis=-1)                          # dout_i . out_i
    dq, dk, dv = np.zeros_like(qk_r), np.zeros_like(qk_r), np.zeros_like(v_r)
    scale = v.dtype.type(qk.shape[-1] ** -0.5)
    log_meets = np.log(np.arange(1, n_hashes + 1)).astype(v.dtype)
    for r in range(n_hashes):
        for parity in (0, 1):                      # even chunks, then odd: no shared keys
            _backward_round(qk_r, k_r, v_r, dout_r, order[r], chunk, has_other, chunk_size,
                            causal, scale, log_meets, lse, delta, parity, dq, dk, dv)
    dk = dk.reshape(qk.shape)
    k = k_r.reshape(qk.shape)
    return dq.reshape(qk.shape) + lsh.unit_keys_backward(dk, k, norm), dv.reshape(v.shape)


@njit(cache=True, error_model="numpy")
def _gather(x, positions):
    """The rows x[positions] (len, W), C-contiguous."""
    rows = np.empty((positions.size, x.shape[1]), dtype=x.dtype)
    for a in range(positions.size):
        rows[a] = x[positions[a]]
    return rows


@njit(cache=True, error_model="numpy")
def _logits(qk, k, order, chunk, has_other, r, ch, c, causal, scale, log_meets):
    """One chunk's queries against its window, for row r (batch x head) of chunk ``ch``.

    Returns (queries, keys, query rows (nq, D), key rows (nk, D), logits (nq, nk)): the
    logits l_ij - log c_ij where the window allows (i, j), -inf elsewhere.
    """
    n = order.shape[1]
    mid, end = ch * c, min(ch * c + c, n)
    queries, keys = order[r, mid:end], order[r, max(mid - c, 0):end]   # previous chunk, own
    q, kw = _gather(qk[r], queries), _gather(k[r], keys)
    logits = np.empty((queries.size, keys.size), dtype=q.dtype)
    gemm(q, kw.T, logits, 0)                                        # qk_i . k_j
    n_hashes = chunk.shape[0]
    for a in range(queries.size):
        i = queries[a]
        for b in range(keys.size):
            j = keys[b]
            if (causal and j > i) or (j == i and has_other[r, i]):
                logits[a, b] = -np.inf                              # hidden
                continue
            logit = logits[a, b] * scale
            if n_hashes > 1:
                meets = 0                                           # c_ij >= 1: this round
                for h in range(n_hashes):
                    gap = chunk[h, r, i] - chunk[h, r, j]
                    if gap == 0 or gap == 1:                        # j in i's window
                        meets += 1
                logit -= log_meets[meets - 1]                       # l_ij - log c_ij
            logits[a, b] = logit
    return queries, keys, q, kw, logits


@njit(cache=True, error_model="numpy")
def _row_max(x):
    """max(x), NaN if any entry is NaN, -inf for an all -inf row."""
    top = x.dtype.type(-np.inf)
    for value in x:
        if value != value:
            return value
        top = max(top, value)
    return top


@njit(parallel=True, cache=True, error_model="numpy")
def _forward_round(qk, k, v, order, chunk, has_other, c, causal, scale, log_meets,
                   top, total, acc):
    """Add one round to every query's (m_i, s_i, a_i). order (R, N) is this round's."""
    rows, n = order.shape
    n_chunks = -(-n // c)
    for unit in prange(rows * n_chunks):
        r, ch = divmod(np.int64(unit), n_chunks)                    # prange counts unsigned
        queries, keys, _, _, p = _logits(qk, k, order, chunk, has_other, r, ch, c, causal,
                                         scale, log_meets)
        alpha = np.ones(queries.size, dtype=p.dtype)                # e^{m_i - m_new}
        for a in range(queries.size):
            i = queries[a]
            new = _row_max(p[a])
            if new == -np.inf:                                      # no key this round
                p[a] = 0
                continue
            old = top[r, i]
            new = new if (new != new or new > old) else old         # m_new; NaN stays NaN
            alpha[a] = np.exp(old - new)                            # 0 on a query's first key
            top[r, i] = new
            row_sum = p.dtype.type(0)
            for b in range(keys.size):
                p[a, b] = np.exp(p[a, b] - new)                     # overflow-free, <= 1
                row_sum += p[a, b]
            total[r, i] = alpha[a] * total[r, i] + row_sum
        part = np.empty((queries.size, v.shape[2]), dtype=p.dtype)
        gemm(p, _gather(v[r], keys), part, 0)                       # sum_j e^{l_ij - m} v_j
        for a in range(queries.size):
            acc[r, queries[a]] = alpha[a] * acc[r, queries[a]] + part[a]


@njit(parallel=True, cache=True, error_model="numpy")
def _backward_round(qk, k, v, dout, order, chunk, has_other, c, causal, scale, log_meets,
                    lse, delta, parity, dq, dk, dv):
    """Add one round's share to dq, dk (with respect to the unit keys) and dv, for the
    chunks of one ``parity``."""
    rows, n = order.shape
    n_chunks = -(-n // c)
    per_row = (n_chunks + 1 - parity) // 2
    for unit in prange(rows * per_row):
        r, u = divmod(np.int64(unit), per_row)
        ch = 2 * u + parity
        queries, keys, q, kw, p = _logits(qk, k, order, chunk, has_other, r, ch, c, causal,
                                          scale, log_meets)
        for a in range(queries.size):
            for b in range(keys.size):
                p[a, b] = np.exp(p[a, b] - lse[r, queries[a]])      # P^r_ij
        dout_q = _gather(dout[r], queries)
        dv_w = np.empty((keys.size, v.shape[2]), dtype=p.dtype)
        gemm(p.T, dout_q, dv_w, 0)                                  # P^T dout
        dp = np.empty(p.shape, dtype=p.dtype)
        gemm(dout_q, _gather(v[r], keys).T, dp, 0)                  # dP_ij = dout_i . v_j
        for a in range(queries.size):
            for b in range(keys.size):
                p[a, b] *= (dp[a, b] - delta[r, queries[a]]) * scale   # dl_ij
        dq_c = np.empty(q.shape, dtype=p.dtype)
        gemm(p, kw, dq_c, 0)                                        # dl k
        dk_w = np.empty(kw.shape, dtype=p.dtype)
        gemm(p.T, q, dk_w, 0)                                       # dl^T qk
        for a in range(queries.size):
            dq[r, queries[a]] += dq_c[a]
        for b in range(keys.size):
            dk[r, keys[b]] += dk_w[b]
            dv[r, keys[b]] += dv_w[b]
