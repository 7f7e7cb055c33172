"""Reformer (LSH) attention (Kitaev et al., 2020, arXiv:2001.04451), the second baseline of
Katharopoulos et al. (2020), arXiv:2006.16236: compiled chunk loops, forward and backward.

The hashing and the sort are compiled too (``lsh_hash``), and the walk over a round's
windows and runs of chunks is in ``lsh_windows``. The kernels work one chunk at a
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

Parallel over (batch x heads) x runs of ``RUN`` consecutive chunks, the rounds one after
another in one compiled loop. A unit walks its run in order: a chunk's rows, gathered as
its queries and own keys, are the next chunk's previous keys, so each row is gathered once
a round, not twice. In a round every query belongs to one chunk, so forward units never
write the same row. In the backward a key's gradient gathers from its own chunk's queries
and the next chunk's: the run adds it to dk and dv once both are in, except at its two
ends, where it meets the runs on either side; so the even runs go first, then the odd
ones, and units of one parity touch disjoint keys. (Numba 0.68 mis-compiled a loop over a
tuple of arrays inside these parallel loops: each array has its own line.) The large
arrays are made in Python, where ``tracemalloc`` sees them.

Key padding (``key_mask``), the reference's semantics: padded rows of qk and v are replaced
by 0 and the hashing sorts padded positions after the real ones, so a row with L real
positions is, to the chunk loops, a sequence of L sorted positions: they walk its first
ceil(L / C) chunks and never touch a padded position, whose output and gradients stay 0.

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
from .lsh_windows import (RUN, chunk_runs, chunk_window, gather_rows, load_window,
                          scatter_add_rows, slide_window)

SUPPORTS = frozenset({"non_causal", "key_mask"})  # options taken by keyword (dispatch)

def _rows(x):
    """(..., N, W) -> (R, N, W), C-contiguous."""
    return np.ascontiguousarray(x.reshape(math.prod(x.shape[:-2]), *x.shape[-2:]))


class Prepared(NamedTuple):
    """What both passes need, as rows (R = batch x heads): qk and the unit keys k (R, N, D),
    the norms (R, N), every round's order and chunk (= rank // C) (n_hashes, R, N), the
    real positions of each row, the first of every round's order, length (R,), has_other
    (R, N), the logit scale 1 / sqrt(D) and log c for c = 1 .. n_hashes, in the inputs'
    dtype."""

    qk: np.ndarray
    k: np.ndarray
    norm: np.ndarray
    order: np.ndarray
    length: np.ndarray
    chunk: np.ndarray
    has_other: np.ndarray
    scale: np.floating
    log_meets: np.ndarray


def _prepare(qk, *, n_hashes, chunk_size, n_buckets, causal, seed, key_mask=None):
    """Unit keys, norms and the hashing: a ``Prepared``. qk already has padded rows 0."""
    k, norm = lsh.unit_keys(qk)
    k_r = _rows(k)
    rows, n = k_r.shape[:2]
    mask = None if key_mask is None else np.ascontiguousarray(key_mask.reshape(rows, n))
    order, rank, has_other = hashing(k_r, n_hashes=n_hashes, chunk_size=chunk_size,
                                     n_buckets=n_buckets, causal=causal, seed=seed,
                                     key_mask=mask)
    length = np.full(rows, n, np.int64) if mask is None else mask.sum(axis=-1, dtype=np.int64)
    dtype = qk.dtype.type
    return Prepared(_rows(qk), k_r, norm.reshape(rows, n), order, length, rank // chunk_size,
                    has_other, dtype(qk.shape[-1] ** -0.5),
                    np.log(np.arange(1, n_hashes + 1)).astype(qk.dtype))


def attend(qk, v, *, n_hashes, chunk_size, n_buckets, causal, seed, key_mask=None):
    """LSH attention, the ``forms.lsh.attend`` semantics. qk (..., N, D), v (..., N, M),
    key_mask (..., N) optional -> out (..., N, M), 0 at padded positions.
    Cost O(n_hashes N (D n_buckets + C (D + M + n_hashes)))."""
    if qk.shape[-2] == 0:
        return np.zeros(v.shape, dtype=v.dtype)
    if key_mask is not None:
        qk, v = lsh.drop_padded(key_mask, qk, v)
    pre = _prepare(qk, n_hashes=n_hashes, chunk_size=chunk_size, n_buckets=n_buckets,
                   causal=causal, seed=seed, key_mask=key_mask)
    out, _ = _forward(pre, _rows(v), chunk_size, causal)
    return out.reshape(v.shape)


def attend_backward(dout, qk, v, *, n_hashes, chunk_size, n_buckets, causal, seed,
                    key_mask=None):
    """(dqk, dv) of ``attend``, the equations of ``forms.lsh.attend_backward``: the forward
    once for lse and out, then per round dv += P^T dout, dl = P (dout v^T - dout . out) /
    sqrt(D), dq += dl k, dk += dl^T qk, and dqk = dq + (dk - k (k . dk)) / ||qk||. Exactly
    0 at padded positions: the loops never reach them."""
    if qk.shape[-2] == 0:
        return np.zeros(qk.shape, dtype=qk.dtype), np.zeros(v.shape, dtype=v.dtype)
    if key_mask is not None:
        qk, v, dout = lsh.drop_padded(key_mask, qk, v, dout)
    pre = _prepare(qk, n_hashes=n_hashes, chunk_size=chunk_size, n_buckets=n_buckets,
                   causal=causal, seed=seed, key_mask=key_mask)
    v_r, dout_r = _rows(v), _rows(dout)
    out, lse = _forward(pre, v_r, chunk_size, causal)
    delta = np.einsum("rnm,rnm->rn", dout_r, out)                  # dout_i . out_i
    dq, dk, dv = np.zeros_like(pre.qk), np.zeros_like(pre.qk), np.zeros_like(v_r)
    _backward_rounds(pre.qk, pre.k, v_r, dout_r, pre.order, pre.length, pre.chunk,
                     pre.has_other, chunk_size, causal, pre.scale, pre.log_meets, lse, delta,
                     dq, dk, dv)
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
    _forward_rounds(pre.qk, pre.k, v, pre.order, pre.length, pre.chunk, pre.has_other, c,
                    causal, pre.scale, pre.log_meets, top, total, acc)
    # s_i > 0 for every real query, which sees a key; a padded one saw none: s_i = 1 keeps
    # its a_i = 0 and its lse -inf
    np.putmask(total, total == 0, 1)
    acc /= total[..., None]
    return acc, top + np.log(total)


@njit(cache=True, error_model="numpy")
def _forward_rounds(qk, k, v, order, length, chunk, has_other, c, causal, scale, log_meets,
                    top, total, acc):
    """Every round into (m_i, s_i, a_i), one parallel pass over the runs of chunks a round."""
    for h in range(len(order)):
        _forward_round(qk, k, v, order[h], length, chunk, has_other, c, causal, scale,
                       log_meets, top, total, acc)


@njit(cache=True, error_model="numpy")
def _backward_rounds(qk, k, v, dout, order, length, chunk, has_other, c, causal, scale,
                     log_meets, lse, delta, dq, dk, dv):
    """Every round into dq, dk (with respect to the unit keys) and dv, two parallel passes
    over the runs of chunks a round."""
    for h in range(len(order)):
        for parity in (0, 1):                      # even runs, then odd: no shared keys
            _backward_round(qk, k, v, dout, order[h], length, chunk, has_other, c, causal,
                            scale, log_meets, lse, delta, parity, dq, dk, dv)


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
def _logits(q, kw, queries, keys, chunk, has_other, r, causal, scale, log_meets):
    """One chunk's queries against its window, row r: St (nk, nq), St[b, a] the logit
    l_ij - log c_ij of query i = queries[a] (rows q) and key j = keys[b] (rows kw) where the
    window allows the pair, -inf elsewhere. Held transposed, keys by queries, so that every
    per-query quantity lies along the contiguous axis and the loops over it vectorise."""
    st = np.empty((keys.size, queries.size), dtype=q.dtype)
    gemm(kw, q.T, st, 0)                                            # k_j . qk_i
    _mask(st, keys, queries, chunk, has_other, r, causal, scale, log_meets)
    return st


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
            top[a] = np.maximum(top[a], row[a])    # NaN stays; no select (see flash_tiles)
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
def _forward_round(qk, k, v, order, length, chunk, has_other, c, causal, scale, log_meets,
                   top, total, acc):
    """Add one round to every query's (m_i, s_i, a_i); order (R, N) is this round's, its
    first length[r] entries row r's real positions. A unit walks a run of chunks in order,
    so each key row is gathered once (``load_window``)."""
    rows, n = order.shape
    _, n_runs = chunk_runs(n, c)
    for unit in prange(rows * n_runs):
        r, run = divmod(np.int64(unit), n_runs)                     # prange counts unsigned
        first = run * RUN
        row = order[r, :length[r]]                                  # the real positions
        n_chunks, _ = chunk_runs(row.size, c)
        q = np.empty((c, qk.shape[2]), dtype=qk.dtype)
        kw, vw = np.empty((2 * c, k.shape[2]), dtype=k.dtype), np.empty((2 * c, v.shape[2]),
                                                                         dtype=v.dtype)
        for ch in range(first, min(first + RUN, n_chunks)):
            mid, lo, end = chunk_window(row, ch, c)
            queries, keys, nq = row[mid:end], row[lo:end], end - mid
            pt = _logits(gather_rows(qk[r], queries, q[:nq]),
                         load_window(kw, k[r], row, ch, c, first), queries, keys, chunk,
                         has_other[r], r, causal, scale, log_meets)
            shift = _column_max(pt, np.empty(nq, dtype=pt.dtype))  # this round's maxima
            alpha = np.ones(nq, dtype=pt.dtype)                     # e^{m_i - m_new}
            for a in range(nq):
                new, old = shift[a], top[r, queries[a]]
                if new == pt.dtype.type(-np.inf):                   # no key this round:
                    shift[a] = 0                                    # its exps are 0
                    continue
                new = new if (new != new or new > old) else old     # m_new; NaN stays NaN
                alpha[a] = np.exp(old - new)                        # 0 on a query's first key
                top[r, queries[a]] = shift[a] = new
            sums = np.empty(nq, dtype=pt.dtype)
            _exp_columns(pt, shift, sums)                           # e^{l_ij - m}, <= 1
            part = np.empty((nq, v.shape[2]), dtype=pt.dtype)
            gemm(pt.T, load_window(vw, v[r], row, ch, c, first), part, 0)   # sum e^{..} v_j
            for a in range(nq):
                i = queries[a]
                total[r, i] = alpha[a] * total[r, i] + sums[a]
                acc_i = acc[r, i]
                for e in range(part.shape[1]):
                    acc_i[e] = alpha[a] * acc_i[e] + part[a, e]


@njit(parallel=True, cache=True, error_model="numpy")
def _backward_round(qk, k, v, dout, order, length, chunk, has_other, c, causal, scale,
                    log_meets, lse, delta, parity, dq, dk, dv):
    """Add one round's share to dq, dk (with respect to the unit keys) and dv, for the runs
    of one ``parity``; order (R, N) is this round's, its first length[r] entries row r's
    real positions.

    A unit walks a run of chunks in order. A key's gradient gathers from its own chunk's
    queries and from the next chunk's, so the run holds the window's gradient rows (the
    previous chunk's, then its own) and adds the previous chunk's to dk and dv once both
    are in; a run's first chunk and its last add what they have, and the runs next to it
    (the other parity) the rest."""
    rows, n = order.shape
    _, n_runs = chunk_runs(n, c)
    per_row = (n_runs + 1 - parity) // 2
    d, m = k.shape[2], v.shape[2]
    for unit in prange(rows * per_row):
        r, u = divmod(np.int64(unit), per_row)
        first = (2 * u + parity) * RUN
        row = order[r, :length[r]]                                  # the real positions
        n_chunks, _ = chunk_runs(row.size, c)
        q, dout_q = np.empty((c, d), dtype=qk.dtype), np.empty((c, m), dtype=v.dtype)
        kw, vw = np.empty((2 * c, d), dtype=k.dtype), np.empty((2 * c, m), dtype=v.dtype)
        dk_w, dv_w = np.zeros((2 * c, d), dtype=k.dtype), np.zeros((2 * c, m), dtype=v.dtype)
        for ch in range(first, min(first + RUN, n_chunks)):
            mid, lo, end = chunk_window(row, ch, c)
            queries, keys, nq, nk = row[mid:end], row[lo:end], end - mid, end - lo
            if ch > first:                                          # the last chunk's own
                slide_window(dk_w, ch, c)                                 # keys become previous
                slide_window(dv_w, ch, c)
                dk_w[c:], dv_w[c:] = 0, 0
            q_rows = gather_rows(qk[r], queries, q[:nq])
            kw_rows = load_window(kw, k[r], row, ch, c, first)
            pt = _logits(q_rows, kw_rows, queries, keys, chunk, has_other[r], r, causal,
                         scale, log_meets)
            lse_q, delta_q = np.empty(nq, dtype=pt.dtype), np.empty(nq, dtype=pt.dtype)
            for a in range(nq):
                lse_q[a], delta_q[a] = lse[r, queries[a]], delta[r, queries[a]]
            _exp_columns(pt, lse_q, np.empty(nq, dtype=pt.dtype))  # P^r_ij, transposed
            dout_rows = gather_rows(dout[r], queries, dout_q[:nq])
            gemm(pt, dout_rows, dv_w[:nk], 1)                       # dv += P^T dout
            dpt = np.empty(pt.shape, dtype=pt.dtype)
            gemm(load_window(vw, v[r], row, ch, c, first), dout_rows.T, dpt, 0)  # dout_i . v_j
            for b in range(nk):
                for a in range(nq):
                    pt[b, a] *= (dpt[b, a] - delta_q[a]) * scale    # dl_ij
            dq_c = np.empty((nq, d), dtype=pt.dtype)
            gemm(pt.T, kw_rows, dq_c, 0)                            # dq = dl k
            gemm(pt, q_rows, dk_w[:nk], 1)                          # dk += dl^T qk
            scatter_add_rows(dq[r], queries, dq_c)
            previous = keys[:mid - lo]                              # their gradients are in
            scatter_add_rows(dk[r], previous, dk_w[:previous.size])
            scatter_add_rows(dv[r], previous, dv_w[:previous.size])
            if ch == min(first + RUN, n_chunks) - 1:                # the run's last chunk
                scatter_add_rows(dk[r], queries, dk_w[mid - lo:nk])
                scatter_add_rows(dv[r], queries, dv_w[mid - lo:nk])

