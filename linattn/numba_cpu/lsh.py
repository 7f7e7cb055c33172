"""Reformer (LSH) attention (Kitaev et al., 2020, arXiv:2001.04451), the second baseline of
Katharopoulos et al. (2020), arXiv:2006.16236: compiled chunk loops, forward and backward.

The hashing and the sort are compiled too (``lsh_hash``). Each round, one parallel pass
copies the rows in the round's sorted order (``Sorted``), so that a chunk's queries and its
window (the chunk and the one before it, 2 C keys) are contiguous slices; then the kernels
work one chunk at a time: one BLAS product for the logits (``blas.gemm``), mask and
correct them in loops the compiler vectorises (the exp is ``flash_tiles.exp_nonpositive``),
one product for the values. Rounds are combined online, as flash attention combines blocks:
each query keeps its largest logit so far m_i, its sum of exps s_i and its unnormalised
output a_i; a round with maximum m' gives m_new = max(m_i, m'), s_i <- e^{m_i - m_new} s_i
+ sum_j e^{l_ij - m_new}, and a_i likewise; at the end out_i = a_i / s_i and lse_i = m_i +
log s_i. That is the reference's sum_r exp(lse_r - logsumexp lse) out_r without storing
the rounds.

c_ij, the number of rounds in which j lies in i's window, compares every round's chunk of
i and of j, copied in sorted order with the rows. Parallel over (batch x heads) x chunks,
the rounds one after another in one compiled loop. In a round every query belongs to one
chunk, so forward units never write the same row. The backward writes key gradients to the
chunk's own keys and to the previous chunk's, so it runs the even chunks, then the odd
ones: units of one parity touch disjoint keys. The large arrays are made in Python, where
``tracemalloc`` sees them.

Cost per round: O(N C (D + M + n_hashes)) time for the chunks, and the hashing's
O(N D n_buckets); memory O(N (D + M)) (the sorted copies, reused round after round) plus
O(C (C + D + M)) per parallel unit.
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

SORT_BLOCK = 256                 # positions a unit of the sorting pass copies


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
    v_r = _rows(v)
    out, _ = _forward(pre, v_r, Sorted.like((pre.qk, pre.k, v_r), pre), chunk_size, causal)
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
    buffers = Sorted.like((pre.qk, pre.k, v_r, dout_r), pre)     # the forward uses three
    out, lse = _forward(pre, v_r, buffers, chunk_size, causal)
    delta = np.einsum("rnm,rnm->rn", dout_r, out)                  # dout_i . out_i
    dq, dk, dv = np.zeros_like(pre.qk), np.zeros_like(pre.qk), np.zeros_like(v_r)
    _backward_rounds(pre.qk, pre.k, v_r, dout_r, pre.order, pre.chunk, pre.has_other,
                     chunk_size, causal, pre.scale, pre.log_meets, lse, delta, buffers,
                     dq, dk, dv)
    _add_unit_keys_backward(dq, dk, pre.k, pre.norm)               # the key side
    return dq.reshape(qk.shape), dv.reshape(v.shape)


class Sorted(NamedTuple):
    """One round's rows in its sorted order, rewritten round after round: the x of
    ``arrays`` (qk, k, v and, backward, dout), each (R, N, W), every round's chunk (H, R, N)
    and has_other (R, N), at [r, a] the values of position order[r, a]."""

    arrays: tuple
    chunk: np.ndarray
    has_other: np.ndarray

    @classmethod
    def like(cls, arrays, pre):
        """Empty buffers for ``arrays`` and the ``Prepared`` pre's chunk and has_other."""
        return cls(tuple(np.empty_like(x) for x in arrays),
                   np.empty(pre.chunk.shape, dtype=np.int32), np.empty_like(pre.has_other))


def _forward(pre, v, buffers, c, causal):
    """(out (R, N, M), lse (R, N)) over all rounds, for a ``Prepared`` and v (R, N, M), with
    ``Sorted`` buffers whose first three arrays are for qk, k and v. The arrays are made in
    Python, where ``tracemalloc`` sees them, and filled by the compiled ``_forward_rounds``."""
    rows, n, _ = v.shape
    top = np.full((rows, n), -np.inf, dtype=v.dtype)                # m_i
    total = np.zeros((rows, n), dtype=v.dtype)                      # s_i
    acc = np.zeros(v.shape, dtype=v.dtype)                          # a_i
    _forward_rounds(pre.qk, pre.k, v, pre.order, pre.chunk, pre.has_other, c, causal,
                    pre.scale, pre.log_meets, buffers, top, total, acc)
    acc /= total[..., None]                            # s_i > 0: every query sees a key
    return acc, top + np.log(total)


@njit(cache=True, error_model="numpy")
def _forward_rounds(qk, k, v, order, chunk, has_other, c, causal, scale, log_meets, buffers,
                    top, total, acc):
    """Every round into (m_i, s_i, a_i): per round, one parallel pass to sort the rows, one
    over the chunks."""
    qs, ks, vs = buffers.arrays[0], buffers.arrays[1], buffers.arrays[2]
    for h in range(len(order)):
        _sort_rows(order[h], chunk, has_other, (qk, k, v), buffers)
        _forward_round(qs, ks, vs, order[h], buffers.chunk, buffers.has_other, c, causal,
                       scale, log_meets, top, total, acc)


@njit(cache=True, error_model="numpy")
def _backward_rounds(qk, k, v, dout, order, chunk, has_other, c, causal, scale, log_meets,
                     lse, delta, buffers, dq, dk, dv):
    """Every round into dq, dk (with respect to the unit keys) and dv: per round, one
    parallel pass to sort the rows, two over the chunks."""
    qs, ks, vs, douts = buffers.arrays
    for h in range(len(order)):
        _sort_rows(order[h], chunk, has_other, (qk, k, v, dout), buffers)
        for parity in (0, 1):                      # even chunks, then odd: no shared keys
            _backward_round(qs, ks, vs, douts, order[h], buffers.chunk, buffers.has_other,
                            c, causal, scale, log_meets, lse, delta, parity, dq, dk, dv)


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


@njit(parallel=True, cache=True, error_model="numpy")
def _sort_rows(order, chunk, has_other, arrays, buffers):
    """One round's ``Sorted`` rows into ``buffers``: the x of ``arrays`` (R, N, W), every
    round's chunk (H, R, N) and has_other (R, N) at the positions order (R, N)."""
    sorted_arrays, sorted_chunk, sorted_other = buffers
    rows, n = order.shape
    per_row = -(-n // SORT_BLOCK)
    for unit in prange(rows * per_row):
        r, first = divmod(np.int64(unit), per_row)
        lo, hi = first * SORT_BLOCK, min(first * SORT_BLOCK + SORT_BLOCK, n)
        positions = order[r, lo:hi]
        for x in range(len(arrays)):       # by index: a zip of the tuples copied wrong rows
            _copy_rows(arrays[x][r], positions, sorted_arrays[x][r, lo:hi])
        for h in range(chunk.shape[0]):
            for a in range(hi - lo):
                sorted_chunk[h, r, lo + a] = chunk[h, r, positions[a]]
        for a in range(hi - lo):
            sorted_other[r, lo + a] = has_other[r, positions[a]]


@njit(cache=True, error_model="numpy")
def _copy_rows(x, positions, out):
    """out[a] = x[positions[a]] for rows of x (N, W) and out (len, W)."""
    for a in range(positions.size):
        j = positions[a]
        for e in range(x.shape[1]):
            out[a, e] = x[j, e]


@njit(cache=True, error_model="numpy")
def _logits(qs, ks, order, sorted_chunk, sorted_other, r, ch, c, causal, scale, log_meets):
    """One chunk's queries against its window (its own keys and the previous chunk's), row
    r of the sorted rows: (mid, lo, end, logits (end - mid, end - lo)), the queries being
    sorted positions mid .. end and the keys lo .. end; the logits l_ij - log c_ij where
    the window allows (i, j), -inf elsewhere."""
    n = order.shape[1]
    mid, end = ch * c, min(ch * c + c, n)
    lo = max(mid - c, 0)
    logits = np.empty((end - mid, end - lo), dtype=qs.dtype)
    gemm(qs[r, mid:end], ks[r, lo:end].T, logits, 0)                # qk_i . k_j
    _mask(logits, order[r], sorted_chunk, sorted_other[r], r, mid, lo, causal, scale,
          log_meets)
    return mid, lo, end, logits


@njit(cache=True, error_model="numpy")
def _mask(logits, order, sorted_chunk, sorted_other, r, mid, lo, causal, scale, log_meets):
    """logits[a, b] (sorted query mid + a, sorted key lo + b of row r) <- l_ij - log c_ij,
    or -inf where j is hidden from i: j > i when causal, j = i when i sees another key.
    order (N,) and sorted_other (N,) are row r's, sorted_chunk (H, R, N) every row's."""
    n_hashes = sorted_chunk.shape[0]
    nq, nk = logits.shape
    hidden = logits.dtype.type(-np.inf)                             # in the logits' dtype
    meets = np.empty(nk, dtype=np.int32)
    for a in range(nq):
        row = logits[a]
        for b in range(nk):
            row[b] *= scale                                         # l_ij
        if n_hashes > 1:
            meets[:] = 0                                            # c_ij >= 1: this round
            for h in range(n_hashes):
                chunk_i, chunk_j = sorted_chunk[h, r, mid + a], sorted_chunk[h, r, lo:lo + nk]
                for b in range(nk):
                    gap = chunk_i - chunk_j[b]
                    meets[b] += (gap == 0) | (gap == 1)             # j in i's window
            for b in range(nk):
                row[b] -= log_meets[meets[b] - 1]                   # l_ij - log c_ij
        i = order[mid + a]
        if causal:
            keys = order[lo:lo + nk]
            for b in range(nk):
                row[b] = hidden if keys[b] > i else row[b]          # j > i
        if sorted_other[mid + a]:
            row[mid - lo + a] = hidden                              # itself, when not alone


@njit(cache=True, error_model="numpy")
def _row_max(x):
    """max(x), NaN if any entry is NaN, -inf for an all -inf row."""
    top = x.dtype.type(-np.inf)
    for value in x:
        if value != value:
            return value
        top = max(top, value)
    return top


@njit(cache=True, error_model="numpy")
def _exp_shifted(row, shift):
    """row[b] <- exp(row[b] - shift) in place, and returns the sum; row[b] <= shift, up to
    rounding, or NaN. A loop of its own, so that the compiler vectorises the exp."""
    for b in range(row.size):
        row[b] = exp_nonpositive(row[b] - shift)
    total = row.dtype.type(0)
    for b in range(row.size):
        total += row[b]
    return total


@njit(parallel=True, cache=True, error_model="numpy")
def _forward_round(qs, ks, vs, order, sorted_chunk, sorted_other, c, causal, scale,
                   log_meets, top, total, acc):
    """Add one round to every query's (m_i, s_i, a_i); the rows sorted by this round's
    order (R, N)."""
    rows, n = order.shape
    n_chunks = -(-n // c)
    for unit in prange(rows * n_chunks):
        r, ch = divmod(np.int64(unit), n_chunks)                    # prange counts unsigned
        mid, lo, end, p = _logits(qs, ks, order, sorted_chunk, sorted_other, r, ch, c,
                                  causal, scale, log_meets)
        alpha = np.ones(end - mid, dtype=p.dtype)                   # e^{m_i - m_new}
        for a in range(end - mid):
            i = order[r, mid + a]
            new = _row_max(p[a])
            if new == p.dtype.type(-np.inf):                        # no key this round
                p[a] = 0
                continue
            old = top[r, i]
            new = new if (new != new or new > old) else old         # m_new; NaN stays NaN
            alpha[a] = np.exp(old - new)                            # 0 on a query's first key
            top[r, i] = new
            total[r, i] = alpha[a] * total[r, i] + _exp_shifted(p[a], new)  # overflow-free
        part = np.empty((end - mid, vs.shape[2]), dtype=p.dtype)
        gemm(p, vs[r, lo:end], part, 0)                             # sum_j e^{l_ij - m} v_j
        for a in range(end - mid):
            acc_i = acc[r, order[r, mid + a]]
            for e in range(part.shape[1]):
                acc_i[e] = alpha[a] * acc_i[e] + part[a, e]


@njit(parallel=True, cache=True, error_model="numpy")
def _backward_round(qs, ks, vs, douts, order, sorted_chunk, sorted_other, c, causal, scale,
                    log_meets, lse, delta, parity, dq, dk, dv):
    """Add one round's share to dq, dk (with respect to the unit keys) and dv, for the
    chunks of one ``parity``; the rows sorted by this round's order (R, N)."""
    rows, n = order.shape
    n_chunks = -(-n // c)
    per_row = (n_chunks + 1 - parity) // 2
    for unit in prange(rows * per_row):
        r, u = divmod(np.int64(unit), per_row)
        mid, lo, end, p = _logits(qs, ks, order, sorted_chunk, sorted_other, r,
                                  2 * u + parity, c, causal, scale, log_meets)
        for a in range(end - mid):
            _exp_shifted(p[a], lse[r, order[r, mid + a]])           # P^r_ij
        dout_q = douts[r, mid:end]
        dv_w = np.empty((end - lo, vs.shape[2]), dtype=p.dtype)
        gemm(p.T, dout_q, dv_w, 0)                                  # P^T dout
        dp = np.empty(p.shape, dtype=p.dtype)
        gemm(dout_q, vs[r, lo:end].T, dp, 0)                        # dP_ij = dout_i . v_j
        for a in range(end - mid):
            delta_i = delta[r, order[r, mid + a]]
            for b in range(end - lo):
                p[a, b] *= (dp[a, b] - delta_i) * scale             # dl_ij
        dq_c = np.empty((end - mid, qs.shape[2]), dtype=p.dtype)
        gemm(p, ks[r, lo:end], dq_c, 0)                             # dl k
        dk_w = np.empty((end - lo, qs.shape[2]), dtype=p.dtype)
        gemm(p.T, qs[r, mid:end], dk_w, 0)                          # dl^T qk
        _scatter_add(dq[r], order[r, mid:end], dq_c)
        _scatter_add(dk[r], order[r, lo:end], dk_w)
        _scatter_add(dv[r], order[r, lo:end], dv_w)


@njit(cache=True, error_model="numpy")
def _scatter_add(x, positions, rows):
    """x[positions[a]] += rows[a] for every a (distinct positions)."""
    for a in range(positions.size):
        x_a = x[positions[a]]
        for e in range(x.shape[1]):
            x_a[e] += rows[a, e]
