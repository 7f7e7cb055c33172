"""Softmax attention, Eq. (2) and its causal mask (Eq. 8) of Katharopoulos et al. (2020),
arXiv:2006.16236, and its backward, as compiled loops that never hold the N x N matrix.

Each worker takes the queries of one row (batch x head) at a stride, and keeps one row of
logits: O(N) memory per worker instead of NumPy's O(N^2), the same O(N^2 max(D, M)) time.
The backward recomputes the probabilities twice: by query rows for dq (keeping each row's
maximum, sum and dout . out), then by key columns for dk and dv. Keys, values, queries and
dout are transposed once so every inner loop runs along positions (SIMD, no reduction).
Oracle: ``linattn.softmax`` (NumPy). Same signatures: already validated arrays.
"""
import math

import numpy as np
from numba import njit, prange

from .loops import n_blocks


def _rows(x):
    return x.reshape(math.prod(x.shape[:-2]), *x.shape[-2:])


def _rows_t(x):
    """(..., N, W) -> (R, W, N), C-contiguous: positions last."""
    return np.ascontiguousarray(_rows(x).swapaxes(-1, -2))


def attend(q, k, v, *, causal, scale):
    """out = softmax(scale q k^T) v, row by row (Eq. 2; causal: j <= i, Eq. 8).
    Shapes (..., N, D), (..., N, M) -> (..., N, M). Cost O(N^2 (D + M)) time, O(N) memory
    per worker."""
    q_rows, k_rows, v_rows = (np.ascontiguousarray(_rows(x)) for x in (q, k, v))
    out = np.empty_like(v_rows)
    stats = np.empty((3, *out.shape[:-1]), dtype=v.dtype)
    none = np.empty((0, 0, 0), dtype=v.dtype)
    _by_queries(q_rows, k_rows, _rows_t(k), v_rows, none, none, causal, v.dtype.type(scale),
                out, none, stats, _workers(out))
    return out.reshape(v.shape)


def attend_backward(dout, q, k, v, *, causal, scale):
    """(dq, dk, dv) of ``attend``: dv = P^T dout, dL = P * (dout v^T - rowsum(dout * out)),
    dq = scale dL k, dk = scale dL^T q, with P recomputed, never stored."""
    q_rows, k_rows, v_rows, dout_rows = (np.ascontiguousarray(_rows(x)) for x in (q, k, v, dout))
    scale = v.dtype.type(scale)
    out, dq = np.empty_like(v_rows), np.empty_like(q_rows)
    stats = np.empty((3, *out.shape[:-1]), dtype=v.dtype)       # row max, row sum, dout . out
    _by_queries(q_rows, k_rows, _rows_t(k), v_rows, _rows_t(v), dout_rows, causal, scale,
                out, dq, stats, _workers(out))
    dk, dv = np.empty_like(k_rows), np.empty_like(v_rows)
    _by_keys(q_rows, _rows_t(q), k_rows, v_rows, dout_rows, _rows_t(dout), causal, scale,
             stats, dk, dv, _workers(out))
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


def _workers(out):
    return n_blocks(out.shape[0], out.shape[1])


@njit(parallel=True, cache=True, error_model="numpy")
def _by_queries(q, k, kt, v, vt, dout, causal, scale, out, dq, stats, n_workers):
    """Query rows: out_i = sum_j P_ij v_j and, if dout has rows, dq_i = scale sum_j dL_ij k_j.

    q, k (R, N, D); kt (R, D, N); v (R, N, M), vt (R, M, N); stats (3, R, N) receives each
    row's maximum logit, sum of exps and dout_i . out_i for ``_by_keys``.
    """
    rows, n, width_d = q.shape
    backward = dout.shape[0] > 0
    for unit in prange(rows * n_workers):
        r, worker = divmod(np.int64(unit), n_workers)  # prange counts unsigned
        p, dp = np.empty(n, dtype=out.dtype), np.empty(n, dtype=out.dtype)
        for i in range(worker, n, n_workers):           # strided: equal shares when causal
            keys = i + 1 if causal else n
            top, total = _softmax_row(q[r, i], kt[r], scale, keys, p)
            stats[0, r, i], stats[1, r, i] = top, total
            for j in range(keys):
                p[j] /= total                           # P_ij
            _weighted_sum(p, v[r], keys, out[r, i])     # out_i = sum_j P_ij v_j, Eq. (2)
            if backward:
                delta = np.sum(dout[r, i] * out[r, i])  # rowsum(dP * P) = dout_i . out_i
                stats[2, r, i] = delta
                _dot_rows(dout[r, i], vt[r], keys, dp)  # dP_ij = dout_i . v_j
                for j in range(keys):
                    p[j] *= (dp[j] - delta) * scale     # dL_ij / d(q_i . k_j)
                _weighted_sum(p, k[r], keys, dq[r, i])  # dq_i = sum_j dL_ij k_j


@njit(parallel=True, cache=True, error_model="numpy")
def _by_keys(q, qt, k, v, dout, doutt, causal, scale, stats, dk, dv, n_workers):
    """Key columns: dv_j = sum_i P_ij dout_i and dk_j = scale sum_i dL_ij q_i, with P_ij
    rebuilt from the row statistics of ``_by_queries``."""
    rows, n, width_d = q.shape
    for unit in prange(rows * n_workers):
        r, worker = divmod(np.int64(unit), n_workers)
        p, dp = np.empty(n, dtype=dv.dtype), np.empty(n, dtype=dv.dtype)
        for j in range(worker, n, n_workers):
            first = j if causal else 0                  # queries that see key j
            count = n - first
            _dot_rows(k[r, j] * scale, qt[r, :, first:], count, p)   # logits of column j
            for i in range(count):
                p[i] = np.exp(p[i] - stats[0, r, first + i]) / stats[1, r, first + i]  # P_ij
            _weighted_sum(p, dout[r, first:], count, dv[r, j])         # dv_j = sum_i P_ij dout_i
            _dot_rows(v[r, j], doutt[r, :, first:], count, dp)         # dP_ij = dout_i . v_j
            for i in range(count):
                p[i] *= (dp[i] - stats[2, r, first + i]) * scale
            _weighted_sum(p, q[r, first:], count, dk[r, j])            # dk_j = sum_i dL_ij q_i


@njit(cache=True, error_model="numpy")
def _softmax_row(x, yt, scale, count, p):
    """p[:count] = exp(logits - max) with logits_j = scale x . y_j (yt is (D, N));
    returns (max, sum). A NaN logit makes the sum NaN: the row is poisoned, as in NumPy."""
    _dot_rows(x * scale, yt, count, p)
    top = p[0]
    for j in range(count):
        top = max(top, p[j])
    total = p.dtype.type(0)
    for j in range(count):
        p[j] = np.exp(p[j] - top)                       # overflow-free: every term <= 1
        total += p[j]
    return top, total


@njit(cache=True, error_model="numpy")
def _dot_rows(x, yt, count, dots):
    """dots[j] = x . y_j for j < count, with yt = y transposed (W, >= count): one axpy per
    component of x, along positions."""
    dots[:count] = 0
    for w in range(x.size):
        xw, y_row = x[w], yt[w]
        for j in range(count):
            dots[j] += xw * y_row[j]


@njit(cache=True, error_model="numpy")
def _weighted_sum(weights, y, count, result):
    """result = sum_{j < count} weights_j y_j, y (>= count, W): axpys with two partial sums."""
    acc = np.zeros((2, result.size), dtype=result.dtype)
    for j in range(count):
        wj, y_j, part = weights[j], y[j], acc[j % 2]
        for m in range(result.size):
            part[m] += wj * y_j[m]
    for m in range(result.size):
        result[m] = acc[0, m] + acc[1, m]
