"""Reformer (LSH) attention (Kitaev et al., 2020, arXiv:2001.04451), the second baseline of
Katharopoulos et al. (2020), arXiv:2006.16236: compiled chunk loops, forward and backward.

The hashing and the sort are compiled too (``lsh_hash``). The kernels work one chunk at a
time, its queries against its window (the chunk and the one before it, 2 C keys): gather
their rows, one BLAS product for the logits (``blas.gemm``), mask and correct them, one
product for the values. The logits are held transposed, keys by queries, as
``flash_tiles`` holds softmax's tiles: a query's maximum, its sum of exps, lse and
dout . out then lie along the contiguous axis, so the loops over queries vectorise (the
exp is ``flash_tiles.exp_nonpositive``) where a reduction along a row would not. (Rows
copied in sorted order once a round, for contiguous slices, ran slower: one more pass and
three more N x D arrays.)

Rounds are combined online, as flash attention combines blocks: each query keeps its
largest logit so far m_i, its sum of exps s_i and its unnormalised output a_i; a round with
maximum m' gives m_new = max(m_i, m'), s_i <- e^{m_i - m_new} s_i + sum_j e^{l_ij - m_new},
and a_i likewise; at the end out_i = a_i / s_i and lse_i = m_i + log s_i. That is the
reference's sum_r exp(lse_r - logsumexp lse) out_r without storing the rounds. c_ij, the
number of rounds in which j lies in i's window, compares every round's chunk of i and j.

Parallel over (batch x heads) x chunks, the rounds one after another in one compiled loop.
In a round every query belongs to one chunk, so forward units never write the same row.
The backward writes key gradients to the chunk's own keys and to the previous chunk's, so
it runs the even chunks, then the odd ones: units of one parity touch disjoint keys. The
large arrays are made in Python, where ``tracemalloc`` sees them.

Cost per round: O(N C (D + M + n_hashes)) time for the chunks, and the hashing's
O(N D n_buckets); memory O(N (D + M)) plus O(C (C + D + M + n_hashes)) per parallel unit.
Oracle: ``forms.lsh`` (NumPy). Same signatures: already validated arrays.
"""
import math
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from ..forms import lsh
from .blas import gemm
from .flash_tiles import exp_nonpositive
from .lsh_hash import hashing


def _rows(x):
    """(..., N, W) -> (R, N, W), C-contiguous."""
    return np.ascontiguousarray(x.reshape(math.prod(x.shape[:-2]), *x.shape[-2:]))


class Prepared(NamedTuple):
    """What both passes need, as rows (R = batch x heads): qk and the unit keys k (R, N, D),
    the norms (R, N), every round's order and chunk (= rank // C) (n_hashes, R, N),
    has_other (R, N), the logit scale 1 / sqrt(D) and log c for c = 1 .. n_hashes, in the
    inputs' dtype."""

    qk: np.ndarray
    k: np.ndarray
    norm: np.ndarray
    order: np.ndarray
    chunk: np.ndarray
    has_other: np.ndarray
    scale: np.floating
    log_meets: np.ndarray


def _prepare(qk, *, n_hashes, chunk_size, n_buckets, causal, seed):
    """Unit keys, norms and the hashing: a ``Prepared``."""
    k, norm = lsh.unit_keys(qk)
    k_r = _rows(k)
    order, rank, has_other = hashing(k_r, n_hashes=n_hashes, chunk_size=chunk_size,
                                     n_buckets=n_buckets, causal=causal, seed=seed)
    dtype = qk.dtype.type
    return Prepared(_rows(qk), k_r, norm.reshape(k_r.shape[:2]), order, rank // chunk_size,
                    has_other,
                    dtype(qk.shape[-1] ** -0.5),
                    np.log(np.arange(1, n_hashes + 1)).astype(qk.dtype))


def attend(qk, v, *, n_hashes, chunk_size, n_buckets, causal, seed):
    """LSH attention, the ``forms.lsh.attend`` semantics. qk (..., N, D), v (..., N, M) ->
    out (..., N, M). Cost O(n_hashes N (D n_buckets + C (D + M + n_hashes)))."""
    if qk.shape[-2] == 0:
        return np.zeros(v.shape, dtype=v.dtype)
    pre = _prepare(qk, n_hashes=n_hashes, chunk_size=chunk_size, n_buckets=n_buckets,
                   causal=causal, seed=seed)
    out, _ = _forward(pre, _rows(v), chunk_size, causal)
    return out.reshape(v.shape)


def attend_backward(dout, qk, v, *, n_hashes, chunk_size, n_buckets, causal, seed):
    """(dqk, dv) of ``attend``, the equations of ``forms.lsh.attend_backward``: the forward
    once for lse and out, then per round dv += P^T dout, dl = P (dout v^T - dout . out) /
    sqrt(D), dq += dl k, dk += dl^T qk, and dqk = dq + (dk - k (k . dk)) / ||qk||."""
    if qk.shape[-2] == 0:
        return np.zeros(qk.shape, dtype=qk.dtype), np.zeros(v.shape, dtype=v.dtype)
    pre = _prepare(qk, n_hashes=n_hashes, chunk_size=chunk_size, n_buckets=n_buckets,
                   causal=causal, seed=seed)
    v_r, dout_r = _rows(v), _rows(dout)
    out, lse = _forward(pre, v_r, chunk_size, causal)
    delta = np.einsum("rnm,rnm->rn", dout_r, out)                  # dout_i . out_i
    dq, dk, dv = np.zeros_like(pre.qk), np.zeros_like(pre.qk), np.zeros_like(v_r)
    _backward_rounds(pre.qk, pre.k, v_r, dout_r, pre.order, pre.chunk, pre.has_other,
                     chunk_size, causal, pre.scale, pre.log_meets, lse, delta, dq, dk, dv)
    _add_unit_keys_backward(dq, dk, pre.k, pre.norm)               # the key side
    return dq.reshape(qk.shape), dv.reshape(v.shape)


def _forward(pre, v, c, causal):
    """(out (R, N, M), lse (R, N)) over all rounds, for a ``Prepared`` and v (R, N, M). The
    arrays are made in Python, where ``tracemalloc`` sees them, and filled by the compiled
    ``_forward_rounds``."""
    rows, n, _ = v.shape
    top = np.full((rows, n), -np.inf, dtype=v.dtype)                # m_i
    total = np.zeros((rows, n), dtype=v.dtype)                      # s_i
    acc = np.zeros(v.shape, dtype=v.dtype)                          # a_i
    _forward_rounds(pre.qk, pre.k, v, pre.order, pre.chunk, pre.has_other, c, causal,
                    pre.scale, pre.log_meets, top, total, acc)
    acc /= total[..., None]                            # s_i > 0: every query sees a key
    return acc, top + np.log(total)


@njit(cache=True, error_model="numpy")
def _forward_rounds(qk, k, v, order, chunk, has_other, c, causal, scale, log_meets, top,
                    total, acc):
    """Every round into (m_i, s_i, a_i), one parallel pass over the chunks a round."""
    for h in range(len(order)):
        _forward_round(qk, k, v, order[h], chunk, has_other, c, causal, scale, log_meets,
                       top, total, acc)


@njit(cache=True, error_model="numpy")
def _backward_rounds(qk, k, v, dout, order, chunk, has_other, c, causal, scale, log_meets,
                     lse, delta, dq, dk, dv):
    """Every round into dq, dk (with respect to the unit keys) and dv, two parallel passes
    over the chunks a round."""
    for h in range(len(order)):
        for parity in (0, 1):                      # even chunks, then odd: no shared keys
            _backward_round(qk, k, v, dout, order[h], chunk, has_other, c, causal, scale,
                            log_meets, lse, delta, parity, dq, dk, dv)


@njit(parallel=True, cache=True, error_model="numpy")
def _add_unit_keys_backward(dq, dk, k, norm):
    """dq += (dk - k (k . dk)) / ||qk|| row by row, in place: ``forms.lsh.unit_keys_backward``
    (dk through k = qk / ||qk||) without its temporaries. dq, dk, k (R, N, D), norm (R, N)."""
    rows, n, d = k.shape
    for r in prange(rows):
        for i in range(n):
            k_dk = k.dtype.type(0)
            for e in range(d):
                k_dk += k[r, i, e] * dk[r, i, e]                    # k . dk
            for e in range(d):
                dq[r, i, e] += (dk[r, i, e] - k[r, i, e] * k_dk) / norm[r, i]


@njit(cache=True, error_model="numpy")
def _gather(x, positions):
    """The rows x[positions] (len, W), C-contiguous, of x (N, W)."""
    rows = np.empty((positions.size, x.shape[1]), dtype=x.dtype)
    for a in range(positions.size):
        j = positions[a]
        for e in range(x.shape[1]):
            rows[a, e] = x[j, e]
    return rows


@njit(cache=True, error_model="numpy")
def _window(order, ch, c):
    """A chunk's queries, its sorted positions mid .. end, and its window's keys, lo .. end
    (the previous chunk's, then its own), in a round's order (N,): (mid, lo, end)."""
    mid = ch * c
    return mid, max(mid - c, 0), min(mid + c, order.size)


@njit(cache=True, error_model="numpy")
def _logits(qk, k, order, chunk, has_other, r, ch, c, causal, scale, log_meets):
    """One chunk's queries against its window, row r, order (R, N) the round's: (queries,
    keys, query rows (nq, D), key rows (nk, D), St (nk, nq)), St[b, a] the logit l_ij -
    log c_ij of query i = queries[a] and key j = keys[b] where the window allows the pair,
    -inf elsewhere. Held transposed, keys by queries, so that every per-query quantity lies
    along the contiguous axis and the loops over it vectorise."""
    mid, lo, end = _window(order[r], ch, c)
    queries, keys = order[r, mid:end], order[r, lo:end]
    q, kw = _gather(qk[r], queries), _gather(k[r], keys)
    st = np.empty((keys.size, queries.size), dtype=q.dtype)
    gemm(kw, q.T, st, 0)                                            # k_j . qk_i
    _mask(st, keys, queries, chunk, has_other[r], r, causal, scale, log_meets)
    return queries, keys, q, kw, st


@njit(cache=True, error_model="numpy")
def _mask(st, keys, queries, chunk, has_other, r, causal, scale, log_meets):
    """St[b, a] (key keys[b], query queries[a], the queries being the window's last keys)
    <- l_ij - log c_ij, or -inf where j is hidden from i: j > i when causal, j = i when i
    sees another key. chunk (H, R, N) every round's, has_other (N,) row r's."""
    n_hashes = chunk.shape[0]
    nk, nq = st.shape
    own = nk - nq                                                   # query a is key own + a
    hidden = st.dtype.type(-np.inf)                                 # in the logits' dtype
    if n_hashes > 1:                                                # every round's chunks
        window_chunk = np.empty((n_hashes, nk), dtype=np.int32)
        for h in range(n_hashes):
            for b in range(nk):
                window_chunk[h, b] = chunk[h, r, keys[b]]
        meets = np.empty(nq, dtype=np.int32)
    for b in range(nk):
        row = st[b]
        for a in range(nq):
            row[a] *= scale                                         # l_ij
        if n_hashes > 1:
            meets[:] = 0                                            # c_ij >= 1: this round
            for h in range(n_hashes):
                chunk_i, chunk_j = window_chunk[h, own:], window_chunk[h, b]
                for a in range(nq):
                    gap = chunk_i[a] - chunk_j
                    meets[a] += (gap == 0) | (gap == 1)             # j in i's window
            for a in range(nq):
                row[a] -= log_meets[meets[a] - 1]                   # l_ij - log c_ij
        if causal:
            j = keys[b]
            for a in range(nq):
                row[a] = hidden if j > queries[a] else row[a]       # j > i
    for a in range(nq):
        if has_other[queries[a]]:
            st[own + a, a] = hidden                                 # itself, when not alone


@njit(cache=True, error_model="numpy")
def _column_max(st, top):
    """top[a] = max over b of St[b, a]: NaN if any is NaN, -inf for an all -inf column."""
    top[:] = -np.inf
    for b in range(st.shape[0]):
        row = st[b]
        for a in range(top.size):
            x = row[a]
            top[a] = x if (x > top[a] or x != x) else top[a]       # a NaN stays
    return top


@njit(cache=True, error_model="numpy")
def _exp_columns(st, shift, total):
    """St[b, a] <- exp(St[b, a] - shift[a]) in place (St[b, a] <= shift[a] up to rounding,
    or NaN), and total[a] = the column's sum."""
    total[:] = 0
    for b in range(st.shape[0]):
        row = st[b]
        for a in range(shift.size):
            row[a] = exp_nonpositive(row[a] - shift[a])
            total[a] += row[a]


@njit(parallel=True, cache=True, error_model="numpy")
def _forward_round(qk, k, v, order, chunk, has_other, c, causal, scale, log_meets, top,
                   total, acc):
    """Add one round to every query's (m_i, s_i, a_i); order (R, N) is this round's."""
    rows, n = order.shape
    n_chunks = -(-n // c)
    for unit in prange(rows * n_chunks):
        r, ch = divmod(np.int64(unit), n_chunks)                    # prange counts unsigned
        queries, keys, _, _, pt = _logits(qk, k, order, chunk, has_other, r, ch, c, causal,
                                          scale, log_meets)
        nq = queries.size
        shift = _column_max(pt, np.empty(nq, dtype=pt.dtype))      # this round's maxima
        alpha = np.ones(nq, dtype=pt.dtype)                         # e^{m_i - m_new}
        for a in range(nq):
            new, old = shift[a], top[r, queries[a]]
            if new == pt.dtype.type(-np.inf):                       # no key this round:
                shift[a] = 0                                        # its exps are 0
                continue
            new = new if (new != new or new > old) else old         # m_new; NaN stays NaN
            alpha[a] = np.exp(old - new)                            # 0 on a query's first key
            top[r, queries[a]] = shift[a] = new
        sums = np.empty(nq, dtype=pt.dtype)
        _exp_columns(pt, shift, sums)                               # e^{l_ij - m}, <= 1
        part = np.empty((nq, v.shape[2]), dtype=pt.dtype)
        gemm(pt.T, _gather(v[r], keys), part, 0)                    # sum_j e^{l_ij - m} v_j
        for a in range(nq):
            i = queries[a]
            total[r, i] = alpha[a] * total[r, i] + sums[a]
            acc_i = acc[r, i]
            for e in range(part.shape[1]):
                acc_i[e] = alpha[a] * acc_i[e] + part[a, e]


@njit(parallel=True, cache=True, error_model="numpy")
def _backward_round(qk, k, v, dout, order, chunk, has_other, c, causal, scale, log_meets,
                    lse, delta, parity, dq, dk, dv):
    """Add one round's share to dq, dk (with respect to the unit keys) and dv, for the
    chunks of one ``parity``; order (R, N) is this round's."""
    rows, n = order.shape
    n_chunks = -(-n // c)
    per_row = (n_chunks + 1 - parity) // 2
    for unit in prange(rows * per_row):
        r, u = divmod(np.int64(unit), per_row)
        queries, keys, q, kw, pt = _logits(qk, k, order, chunk, has_other, r,
                                           2 * u + parity, c, causal, scale, log_meets)
        nq, nk = queries.size, keys.size
        lse_q, delta_q = np.empty(nq, dtype=pt.dtype), np.empty(nq, dtype=pt.dtype)
        for a in range(nq):
            lse_q[a], delta_q[a] = lse[r, queries[a]], delta[r, queries[a]]
        _exp_columns(pt, lse_q, np.empty(nq, dtype=pt.dtype))      # P^r_ij, transposed
        dout_q = _gather(dout[r], queries)
        dv_w = np.empty((nk, v.shape[2]), dtype=pt.dtype)
        gemm(pt, dout_q, dv_w, 0)                                   # P^T dout
        dpt = np.empty(pt.shape, dtype=pt.dtype)
        gemm(_gather(v[r], keys), dout_q.T, dpt, 0)                 # dP_ij = dout_i . v_j
        for b in range(nk):
            for a in range(nq):
                pt[b, a] *= (dpt[b, a] - delta_q[a]) * scale        # dl_ij
        dq_c = np.empty(q.shape, dtype=pt.dtype)
        gemm(pt.T, kw, dq_c, 0)                                     # dl k
        dk_w = np.empty(kw.shape, dtype=pt.dtype)
        gemm(pt, q, dk_w, 0)                                        # dl^T qk
        _scatter_add(dq[r], queries, dq_c)
        _scatter_add(dk[r], keys, dk_w)
        _scatter_add(dv[r], keys, dv_w)


@njit(cache=True, error_model="numpy")
def _scatter_add(x, positions, rows):
    """x[positions[a]] += rows[a] for every a (distinct positions)."""
    for a in range(positions.size):
        x_a = x[positions[a]]
        for e in range(x.shape[1]):
            x_a[e] += rows[a, e]
