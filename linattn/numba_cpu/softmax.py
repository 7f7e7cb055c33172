"""Softmax attention, Eq. (2) and its causal mask (Eq. 8) of Katharopoulos et al. (2020),
arXiv:2006.16236, and its backward, in tiles that never hold the Nq x Nk matrix: the online
softmax of FlashAttention-2 (Dao 2023, arXiv:2307.08691, Algorithms 1 and 2) on the CPU.

Forward, for each block of B queries Q_b, over the blocks of C keys K_c, V_c (causal: those
up to the diagonal), with a running row maximum m, row sum l and output O (B, M):
    L = scale Q_b K_c^T,  m' = max(m, rowmax L),  P = exp(L - m'),
    l = exp(m - m') l + rowsum P,  O = diag(exp(m - m')) O + P V_c,
and at the end out_b = O / l and the log-sum-exp lse = m + log l (B,), kept for the backward.
Backward (given dout), with D = rowsum(dout * out), for each key block, over query blocks:
    P = exp(scale Q_b K_c^T - lse),  dV_c += P^T dO_b,  dP = dO_b V_c^T,
    dL = P * (dP - D),  dK_c += scale dL^T Q_b,  dQ_b += scale dL K_c.
``attend`` returns lse with ``return_lse``, and ``attend_backward`` takes it with out
(``out``, ``lse``); without them it runs the forward first for out, lse and D.
The products are BLAS (``blas.gemm``, adding into dK_c, dV_c, dQ_b and O); the element loops
between them are ``flash_tiles``'s, on tiles held transposed (keys x queries). Each unit
copies the operand it keeps (Q_b^T forward, K_c^T and V_c^T backward) into scratch: OpenBLAS
multiplied a C-ordered matrix by a transposed one markedly slower than in the other three
layouts.

Work. Forward units are (row of batch x heads, query block); causal, block i is paired
with block n - 1 - i, so every unit covers about the same keys, (n + 1) B, and the threads
get equal shares even for one head. Backward units are (row, segment of the key blocks);
the key blocks are dealt to the segments in turn (causal: pairs, as above), each unit
owning its dK_c, dV_c.
dq sums over key blocks: each segment adds into its own copy of dq, summed at the end. There
is one segment per row when the rows share out evenly over the threads (8 heads on 2
threads: no copy), else ``threads / gcd(rows, threads)`` (1 head on 2 threads: 2 copies).
Chosen over a second pass for dq by query blocks, which would recompute P and dP (two more
products of the five per tile, and the exps) to save those copies.
Small work (``PARALLEL_WORK``) runs the same units on the calling thread.
Tile sizes: SMALL or LARGE, by the kernel of SciPy's BLAS, SMALL where LARGE's hold of the BLAS
does not take (``planned_tiles``).
Key padding: a padded key's k and v are set to 0 first (padding may hold NaN), and its logits
to -inf in every tile (``flash_tiles.scale_and_max_keys``), its probabilities and their
gradients to exactly 0 (``flash_tiles.zero_keys``). A query with every key padded gets out 0
and gradients 0, as NumPy's form gives.
Memory: out, lse and D (Nq (M + 2)) in the backward, the dq copies, and O(B C) scratch per
unit; never Nq x Nk. Cost: O(Nq Nk (D + M)) time, halved when causal.
It replaced row-by-row loops, several times slower. Against PyTorch's
scaled_dot_product_attention the benchmark's head-to-head rounds measure it
(``docs/performance.md``). Given the forward's out and lse, the backward makes five products a
tile; without them it reruns the forward first (two more).
Oracle: ``linattn.forms.softmax`` (NumPy). Same signatures: already validated arrays.
"""
import contextlib
import math

import numba
import numpy as np
from numba import njit, prange

from . import blas_threads
from . import flash_tiles as tile
from .blas import gemm
from .chunked import SINGLE_THREAD_PRODUCT
from .._checks import rows as as_rows
from ..forms.padding import drop_padded

SUPPORTS = frozenset({"non_causal", "key_mask", "lse"})  # options taken by keyword (dispatch)

# Queries per block B and keys per block C, two sizings, chosen by SciPy's BLAS kernel
# (``blas_threads.large_products``):
# - SMALL: each product (B C max(D, M) multiply-adds) stays under OpenBLAS's threading
#   threshold (``chunked.SINGLE_THREAD_PRODUCT``), and the tile (C, B) within 2^14 elements,
#   in L1-L2. With OpenBLAS's SkylakeX (AVX-512) kernel the largest products under the
#   threshold beat B = C = 64 (a product of 2^18) at D = M = 128 and matched it at 64, and
#   beat tiles of 128 x 128 up to 256 x 256 held to one thread (8 heads, N = 4096, 2 threads).
# - LARGE: each product up to 2^22 multiply-adds and the tile within 2^16 elements (256 x 256
#   at D = M = 64), the BLAS held to one thread (``blas_threads.hold``) where a product
#   reaches the threshold; SMALL where that hold does not take (``planned_tiles``). With
#   OpenBLAS's Haswell (AVX2) kernel they beat SMALL forward and forward + backward, causal
#   and not (D = M = 64, 8 heads, N = 4096, 2 threads): that kernel's small products cost
#   more in calls than the larger tiles lose to the cache.
# Both multiples of ALIGN where they can be.
SMALL = {"query_block": 96, "product": SINGLE_THREAD_PRODUCT - 1, "tile": 2 ** 14}
LARGE = {"query_block": 256, "product": 2 ** 22, "tile": 2 ** 16}
ALIGN = 16
# Less work than this, R Nq Nk (D + M) multiply-adds, runs on the calling thread. At 2^22
# (one generation step, Nq = 1, of 8 heads against 4096 keys, D = M = 64) two threads
# halved the time on an idle machine but took many times longer while other processes held
# the cores (every parallel region then waits for a time slice): small work stays on one.
PARALLEL_WORK = 2 ** 23


def tiles(n_queries, n_keys, d, m, sizing=SMALL):
    """(B, C): queries and keys per tile. SMALL: (80, 96) at D = M = 64, (32, 48) at
    D = M = 256; LARGE: (256, 256) and (128, 128). Few queries (generation: Nq = 1) get long
    key blocks: at D = M = 64 a step against a cache of 4096 keys is one product."""
    wide = max(d, m, 1)
    block_q = min(sizing["query_block"], _aligned(math.isqrt(sizing["product"] // wide)))
    block_q = max(1, min(block_q, n_queries))
    block_k = _aligned(min(sizing["product"] // (block_q * wide), sizing["tile"] // block_q))
    return block_q, max(1, min(n_keys, block_k))


def planned_tiles(n_queries, n_keys, d, m):
    """A context that yields the (B, C) the kernels run with inside it: LARGE where SciPy's
    BLAS kernel favours it (``blas_threads.large_products``), with the BLAS held to one
    thread for the block where a product reaches OpenBLAS's threading threshold; SMALL
    otherwise, and where the hold does not take. Without a hold it is a plain
    ``contextlib.nullcontext`` (a call's few microseconds matter to generation's steps)."""
    if not blas_threads.large_products():
        return contextlib.nullcontext(tiles(n_queries, n_keys, d, m, SMALL))
    large = tiles(n_queries, n_keys, d, m, LARGE)
    if large[0] * large[1] * max(d, m) < SINGLE_THREAD_PRODUCT:
        return contextlib.nullcontext(large)
    return _held(large, tiles(n_queries, n_keys, d, m, SMALL))


@contextlib.contextmanager
def _held(large, small):
    """``large`` inside a hold of the BLAS that took, else ``small``."""
    with blas_threads.hold() as took:
        yield large if took else small


def _aligned(n):
    """n rounded down to a multiple of ALIGN, when it is at least ALIGN."""
    return n - n % ALIGN if n >= ALIGN else n


def _parallel(q, k, v, causal):
    """Whether the work, R Nq Nk (D + M) multiply-adds (half if causal), is worth waking the
    other threads for."""
    work = math.prod(q.shape[:-1]) * k.shape[-2] * (q.shape[-1] + v.shape[-1])
    return work // (2 if causal else 1) >= PARALLEL_WORK


def _check_keys(q, k, causal):
    """Softmax over no keys is undefined (0 / 0): NumPy's reference raises, and so do we."""
    n_queries, n_keys = q.shape[-2], k.shape[-2]
    if causal and n_queries != n_keys:
        raise ValueError(f"causal attention needs Nq == Nk, got {n_queries} and {n_keys}")
    if n_keys == 0 and n_queries > 0:
        raise ValueError(f"softmax over zero keys is undefined ({n_queries} queries)")


def _real_keys(q_rows, k, key_mask):
    """The key mask as C-contiguous rows (R, Nk), or (R, 0) without one (every key real)."""
    if key_mask is None:
        return np.empty((q_rows.shape[0], 0), dtype=np.bool_)
    return np.ascontiguousarray(key_mask.reshape(q_rows.shape[0], k.shape[-2]))


def attend(q, k, v, *, causal, scale, key_mask=None, return_lse=False):
    """out = softmax(scale q k^T) v (Eq. 2; causal: j <= i, Eq. 8) by the online softmax;
    padded keys (``key_mask`` (..., Nk) False) get probability 0. With ``return_lse``,
    (out, lse): lse (..., Nq) the log-sum-exp of each query's logits, -inf for a query
    whose keys are all padded, for ``attend_backward``.

    Shapes q (..., Nq, D), k (..., Nk, D), v (..., Nk, M) -> (..., Nq, M); causal needs
    Nq == Nk. Cost O(Nq Nk (D + M)) time, O(B C) memory per unit besides out and lse.
    """
    _check_keys(q, k, causal)
    k, v = drop_padded(k, v, key_mask)                # 0, not whatever padding holds
    q_rows, k_rows, v_rows = as_rows(q), as_rows(k), as_rows(v)
    real = _real_keys(q_rows, k, key_mask)
    out = np.empty((*q_rows.shape[:-1], v.shape[-1]), dtype=v.dtype)    # (R, Nq, M)
    lse = np.empty(out.shape[:-1], dtype=v.dtype)                        # (R, Nq)
    none = np.empty((0, 0, 0), dtype=v.dtype)
    forward = _forward if _parallel(q, k, v, causal) else _forward_serial
    with planned_tiles(q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]) as blocks:
        forward(q_rows, k_rows, v_rows, none, real, causal, v.dtype.type(scale), *blocks, out,
                lse, lse[:0])
    out = out.reshape((*q.shape[:-1], v.shape[-1]))
    return (out, lse.reshape(q.shape[:-1])) if return_lse else out


def attend_backward(dout, q, k, v, *, causal, scale, key_mask=None, out=None, lse=None):
    """(dq, dk, dv) of ``attend``: dv = P^T dout, dL = P * (dout v^T - rowsum(dout * out)),
    dq = scale dL k, dk = scale dL^T q, with P rebuilt tile by tile from the forward's
    log-sum-exp, never stored; exactly 0 dk, dv at padded keys. Given the forward's ``out``
    (..., Nq, M) and ``lse`` (..., Nq) (``attend`` with ``return_lse``), it uses them; else
    it runs the forward first. Work: five products a tile against the forward's two; seven
    when it reruns the forward."""
    _check_keys(q, k, causal)
    k, v = drop_padded(k, v, key_mask)
    q_rows, k_rows, v_rows, dout_rows = (as_rows(x) for x in (q, k, v, dout))
    real = _real_keys(q_rows, k, key_mask)
    scale = v.dtype.type(scale)
    delta = np.empty(dout_rows.shape[:-1], dtype=v.dtype)               # (R, Nq)
    parallel = _parallel(q, k, v, causal)
    forward, backward = (_forward, _backward) if parallel else (_forward_serial,
                                                                _backward_serial)
    threads = numba.get_num_threads() if parallel else 1
    n_segments = threads // math.gcd(max(1, q_rows.shape[0]), threads)
    dq_parts = np.zeros((n_segments, *q_rows.shape), dtype=v.dtype)      # (S, R, Nq, D)
    dk, dv = np.zeros_like(k_rows), np.zeros_like(v_rows)
    with planned_tiles(q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]) as blocks:
        block_q, block_k = blocks
        if lse is None:
            out_rows, lse_rows = np.empty_like(dout_rows), np.empty_like(delta)
            forward(q_rows, k_rows, v_rows, dout_rows, real, causal, scale, block_q, block_k,
                    out_rows, lse_rows, delta)
        else:
            lse_rows = np.ascontiguousarray(lse.reshape(delta.shape))
            (_row_dots if parallel else _row_dots_serial)(dout_rows, as_rows(out), delta)
        backward(q_rows, k_rows, v_rows, dout_rows, real, lse_rows, delta, causal, scale,
                 block_q, block_k, dq_parts, dk, dv)
    dq = dq_parts[0] if n_segments == 1 else dq_parts.sum(axis=0)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


@njit(parallel=True, cache=True, error_model="numpy")
def _row_dots(dout, out, delta):
    """delta (R, Nq) = rowsum(dout * out) of (R, Nq, M) arrays, the backward's D; rows in
    parallel."""
    for r in prange(dout.shape[0]):
        tile.row_dots(dout[r], out[r], delta[r])


@njit(cache=True, error_model="numpy")
def _row_dots_serial(dout, out, delta):
    """``_row_dots`` on the calling thread."""
    for r in range(dout.shape[0]):
        tile.row_dots(dout[r], out[r], delta[r])


@njit(parallel=True, cache=True, error_model="numpy")
def _forward(q, k, v, dout, real, causal, scale, block_q, block_k, out, lse, delta):
    """out (R, Nq, M) and lse (R, Nq) from q (R, Nq, D), k (R, Nk, D), v (R, Nk, M); if dout
    has rows, also delta = rowsum(dout * out) (R, Nq) for the backward. ``real`` (R, Nk) is
    True for a real key, or (R, 0) when every key is real. Units in parallel."""
    for unit in prange(_forward_units(q, block_q, causal)):
        _forward_unit(np.int64(unit), q, k, v, dout, real, causal, scale, block_q, block_k,
                      out, lse, delta)             # prange counts unsigned


@njit(cache=True, error_model="numpy")
def _forward_serial(q, k, v, dout, real, causal, scale, block_q, block_k, out, lse, delta):
    """``_forward`` on the calling thread: for work too small to wake the other threads."""
    for unit in range(_forward_units(q, block_q, causal)):
        _forward_unit(unit, q, k, v, dout, real, causal, scale, block_q, block_k, out, lse,
                      delta)


@njit(cache=True, error_model="numpy")
def _forward_units(q, block_q, causal):
    """Units of forward work: rows x query blocks, or rows x pairs of them (causal)."""
    blocks = -(-q.shape[1] // block_q)
    return q.shape[0] * ((blocks + 1) // 2 if causal else blocks)


@njit(cache=True, error_model="numpy")
def _forward_unit(unit, q, k, v, dout, real, causal, scale, block_q, block_k, out, lse,
                  delta):
    """One unit: query block b of row r, and causal, also block n - 1 - b, so that every
    unit covers about (n + 1) B keys."""
    n_queries = q.shape[1]
    blocks = -(-n_queries // block_q)
    per_row = (blocks + 1) // 2 if causal else blocks
    r, b = divmod(unit, per_row)
    scratch = np.empty(block_q * block_k, dtype=out.dtype)               # one tile, flat
    q_t = np.empty(block_q * q.shape[2], dtype=out.dtype)               # Q_b^T, flat
    stats = np.empty((4, block_q), dtype=out.dtype)                      # m, l, top, rescale
    for half in range(2 if causal else 1):         # causal: a short block and a long one
        blk = b if half == 0 else blocks - 1 - b
        if half == 1 and blk == b:                 # an odd count's middle block: once
            break
        i0 = blk * block_q
        i1 = min(n_queries, i0 + block_q)
        _forward_block(q[r], k[r], v[r], real[r], causal, scale, i0, i1, block_k, out[r],
                       lse[r], scratch, q_t, stats)
        if dout.shape[0] > 0:
            tile.row_dots(dout[r, i0:i1], out[r, i0:i1], delta[r, i0:i1])   # D = dO . O


@njit(cache=True, error_model="numpy")
def _forward_block(q, k, v, real, causal, scale, i0, i1, block_k, out, lse, scratch, q_t,
                   stats):
    """out[i0:i1] and lse[i0:i1] of one row: the online softmax over its key blocks, padded
    keys (``real`` (Nk,) False; empty: none) left out."""
    n = i1 - i0
    q_bt, out_b = tile.transpose_into(q[i0:i1], q_t), out[i0:i1]     # Q_b^T (D, B)
    m, total, top, rescale = stats[0], stats[1], stats[2], stats[3]
    m[:] = -np.inf                                 # running row maximum
    total[:] = 0                                   # running row sum l
    out_b[:] = 0                                   # running O = sum exp(L - m) V
    stop = i1 if causal else k.shape[0]            # causal: keys j < i1 only
    for j0 in range(0, stop, block_k):
        j1 = min(stop, j0 + block_k)
        St = scratch[:(j1 - j0) * n].reshape(j1 - j0, n)
        gemm(k[j0:j1], q_bt, St, 0)                # S^T = K_c Q_b^T (C, B)
        top[:] = m
        if real.size:                              # L, m' = max(m, rowmax L)
            tile.scale_and_max_keys(St, scale, causal, i0, j0, top, real[j0:j1])
        else:
            tile.scale_and_max(St, scale, causal, i0, j0, top)
        tile.exp_and_sum(St, top, m, total, rescale)            # P, l, exp(m - m')
        tile.scale_rows(out_b, rescale)            # O = diag(exp(m - m')) O
        gemm(St.T, v[j0:j1], out_b, 1)             #     + P V_c, (B, M)
    tile.finish_rows(out_b, m, total, lse[i0:i1])  # out = O / l, lse = m + log l


@njit(parallel=True, cache=True, error_model="numpy")
def _backward(q, k, v, dout, real, lse, delta, causal, scale, block_q, block_k, dq_parts, dk,
              dv):
    """dk, dv (R, Nk, D / M) and dq_parts (S, R, Nq, D), dq's share from each of S segments
    of key blocks, all zeroed by the caller; lse, delta (R, Nq) from ``_forward``
    (or the caller's lse and ``_row_dots``). Units
    (rows x segments) in parallel."""
    for unit in prange(k.shape[0] * dq_parts.shape[0]):
        _backward_unit(np.int64(unit), q, k, v, dout, real, lse, delta, causal, scale,
                       block_q, block_k, dq_parts, dk, dv)


@njit(cache=True, error_model="numpy")
def _backward_serial(q, k, v, dout, real, lse, delta, causal, scale, block_q, block_k,
                     dq_parts, dk, dv):
    """``_backward`` on the calling thread."""
    for unit in range(k.shape[0] * dq_parts.shape[0]):
        _backward_unit(unit, q, k, v, dout, real, lse, delta, causal, scale, block_q, block_k,
                       dq_parts, dk, dv)


@njit(cache=True, error_model="numpy")
def _backward_unit(unit, q, k, v, dout, real, lse, delta, causal, scale, block_q, block_k,
                   dq_parts, dk, dv):
    """One unit: segment s of row r, the key blocks s, s + S, ... (causal: those pairs of
    blocks, i and n - 1 - i), each adding its share of dq into dq_parts[s, r]."""
    n_segments, n_keys = dq_parts.shape[0], k.shape[1]
    r, s = divmod(unit, n_segments)
    blocks = -(-n_keys // block_k)
    per_row = (blocks + 1) // 2 if causal else blocks    # pairs (causal) or blocks
    scratch = np.empty((2, block_q * block_k), dtype=dk.dtype)         # P^T and dP^T
    kv_t = np.empty((2, block_k * max(q.shape[2], v.shape[2])), dtype=dk.dtype)
    for t in range(s, per_row, n_segments):
        for half in range(2 if causal else 1):
            blk = t if half == 0 else blocks - 1 - t
            if half == 1 and blk == t:
                break
            j0 = blk * block_k
            _backward_block(q[r], k[r], v[r], dout[r], real[r], lse[r], delta[r], causal,
                            scale, j0, min(n_keys, j0 + block_k), block_q, dq_parts[s, r],
                            dk[r], dv[r], scratch, kv_t)


@njit(cache=True, error_model="numpy")
def _backward_block(q, k, v, dout, real, lse, delta, causal, scale, j0, j1, block_q, dq, dk,
                    dv, scratch, kv_t):
    """dk[j0:j1], dv[j0:j1] of one row, and key block j0:j1's share of dq, over the query
    blocks that see it (causal: from the block holding query j0); padded keys (``real``
    (Nk,) False; empty: none) have P = 0 and dL = 0."""
    c = j1 - j0
    k_c, dk_c, dv_c = k[j0:j1], dk[j0:j1], dv[j0:j1]
    k_ct = tile.transpose_into(k_c, kv_t[0])      # K_c^T (D, C)
    v_ct = tile.transpose_into(v[j0:j1], kv_t[1])  # V_c^T (M, C)
    start = j0 // block_q * block_q if causal else 0
    for i0 in range(start, q.shape[0], block_q):
        i1 = min(q.shape[0], i0 + block_q)
        n = i1 - i0
        q_b, dout_b = q[i0:i1], dout[i0:i1]
        Pt = scratch[0, :c * n].reshape(c, n)
        dPt = scratch[1, :c * n].reshape(c, n)
        gemm(k_ct.T, q_b.T, Pt, 0)                 # S^T = K_c Q_b^T (C, B)
        # P^T = exp(scale S^T - lse)
        tile.probabilities_t(Pt, scale, causal, i0, j0, lse[i0:i1])
        if real.size:
            tile.zero_keys(Pt, real[j0:j1])        # padding: P = 0
        gemm(Pt, dout_b, dv_c, 1)                  # dV_c += P^T dO_b (C, M)
        gemm(v_ct.T, dout_b.T, dPt, 0)             # dP^T = V_c dO_b^T (C, B)
        # Pt <- scale dL^T = scale P^T * (dP^T - D)
        tile.dlogits_t(Pt, dPt, delta[i0:i1], scale, causal, i0, j0)
        if real.size:
            tile.zero_keys(Pt, real[j0:j1])        # and dL = 0
        gemm(Pt, q_b, dk_c, 1)                     # dK_c += scale dL^T Q_b (C, D)
        gemm(Pt.T, k_c, dq[i0:i1], 1)              # dQ_b += scale dL K_c (B, D)
