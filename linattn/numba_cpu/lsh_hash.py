"""The hashing of Reformer (LSH) attention (Kitaev et al., 2020, arXiv:2001.04451, section 2)
in compiled code: buckets, the sort by (bucket, position) and who sees another key, the
``forms.lsh.hashing`` semantics, for ``numba_cpu.lsh``.

- buckets: h(k_j) = argmax([k_j R, -k_j R]). A block of positions meets R a tile of TILE
  columns at a time, one BLAS product each (``blas.gemm``), all rows (batch x heads) and
  rounds in one parallel loop, and the argmax is carried from tile to tile: no
  (N, n_buckets / 2) array, whose size, N^2 / C with the default bucket count, would be
  128 MB a row at N = 2^15, C = 32. argmax([p, -p]) needs no concatenation: it is the first
  largest p_b unless the least p_b is further from zero (then n_buckets / 2 plus that
  index; a tie goes to the first half, as NumPy's first-occurrence rule does), and the
  first NaN's index when p holds one.
- sort: buckets are small integers, so a counting sort (count each bucket, prefix sums,
  place the positions in increasing order) is stable and O(N + n_buckets) a row, where an
  argsort is O(N log N).
- has_other: as the reference: a window (a chunk and the one before) of two or more
  positions, or, causal, one holding a position below i.
- key padding: as the reference, a padded position goes to bucket n_buckets, one past the
  real ones, so the counting sort puts it after every real position; has_other then reads
  only the first L sorted positions, the real ones.

Cost per round: O(N D n_buckets) for the products (the default n_buckets grows with N, so
this term is quadratic in N: the Reformer's choice), O(N n_buckets) for the argmax, O(N +
n_buckets) for the sort. Memory: O(N) integers per round, and O(block x TILE) floats a
parallel unit, whatever n_buckets.
Oracle: ``forms.lsh.buckets`` and ``forms.lsh.hashing`` (NumPy).
"""
import numpy as np
from numba import njit, prange

from ..forms import lsh
from .blas import gemm
from .chunked import SINGLE_THREAD_PRODUCT

# rotation columns a product takes; its positions, block = SINGLE_THREAD_PRODUCT / (TILE D),
# keep it on the calling thread (127 at D = 64; OpenBLAS's own threads would fight ours)
TILE = 64


@njit(cache=True, error_model="numpy")
def plus_minus_argmax(p):
    """argmax([p, -p]) of a 1-D float array without building [p, -p]: NumPy's index (the
    first occurrence of the largest entry, or the first NaN)."""
    top, low = np.full(1, -np.inf, dtype=p.dtype), np.full(1, np.inf, dtype=p.dtype)
    i_top, i_low, i_nan = _indices(1)
    _fold(p.reshape(-1, 1), 0, top, i_top, low, i_low, i_nan)
    return _plus_minus_index(top[0], i_top[0], low[0], i_low[0], i_nan[0], p.size)


@njit(cache=True, error_model="numpy")
def _indices(size):
    """Three int32 arrays: where the largest and the least p_b are (0 until one is seen), and
    the first NaN (-1: none)."""
    return (np.zeros(size, dtype=np.int32), np.zeros(size, dtype=np.int32),
            np.full(size, -1, dtype=np.int32))


@njit(cache=True, error_model="numpy")
def _fold(tile, first, top, i_top, low, i_low, i_nan):
    """Fold entries first, first + 1, ... of the p of several positions into their running
    argmax: tile (width, positions) holds p_b of position a at [b - first, a], following
    every p_b folded in before; strict comparisons keep the first occurrence. Each step is
    a select over the positions, which the compiler vectorises (a scan along one position's
    p would be a chain of dependent branches, several times slower)."""
    for b in range(tile.shape[0]):
        p_b = tile[b]
        index = np.int32(first + b)
        for a in range(p_b.size):
            x = p_b[a]
            nan = (x != x) & (i_nan[a] < 0)
            i_nan[a] = index if nan else i_nan[a]                  # the first NaN
            up = x > top[a]
            top[a] = x if up else top[a]                           # the largest p_b
            i_top[a] = index if up else i_top[a]
            down = x < low[a]
            low[a] = x if down else low[a]                         # the least p_b
            i_low[a] = index if down else i_low[a]


@njit(cache=True, error_model="numpy")
def _plus_minus_index(top, i_top, low, i_low, i_nan, half):
    """The index into [p, -p] (2 half entries): the first NaN, else the largest p_b unless
    the least p_b is further from zero; a tie goes to the first half (first occurrence)."""
    if i_nan >= 0:
        return np.int64(i_nan)
    return np.int64(i_top) if top >= -low else half + np.int64(i_low)


@njit(parallel=True, cache=True, error_model="numpy")
def buckets(k, rotations_t, out):
    """out[h, r, j] = argmax([k[r, j] R_h, -k[r, j] R_h]) for k (R, N, D) and the rotations
    transposed, rotations_t (H, B/2, D) in k's dtype; out (H, R, N) ints.

    Parallel over rounds x rows x blocks of positions; a block meets R_h a tile of columns
    at a time, one product R_tile^T k_block^T (``blas.gemm``) each, and the argmax is
    carried from tile to tile: O(block x TILE) memory a unit, whatever n_buckets.
    """
    n_hashes, half, d = rotations_t.shape
    rows, n, _ = k.shape
    block = max(1, (SINGLE_THREAD_PRODUCT - 1) // (TILE * d))
    per_row = -(-n // block)
    for unit in prange(n_hashes * rows * per_row):
        h, rest = divmod(np.int64(unit), rows * per_row)           # prange counts unsigned
        r, first = divmod(rest, per_row)
        lo, hi = first * block, min(first * block + block, n)
        top = np.full(hi - lo, -np.inf, dtype=k.dtype)             # largest p_b so far
        low = np.full(hi - lo, np.inf, dtype=k.dtype)              # least p_b so far
        i_top, i_low, i_nan = _indices(hi - lo)
        for col in range(0, half, TILE):
            width = min(TILE, half - col)
            projected = np.empty((width, hi - lo), dtype=k.dtype)
            gemm(rotations_t[h, col:col + width], k[r, lo:hi].T, projected, 0)  # (k R)^T
            _fold(projected, col, top, i_top, low, i_low, i_nan)
        for a in range(hi - lo):
            out[h, r, lo + a] = _plus_minus_index(top[a], i_top[a], low[a], i_low[a],
                                                  i_nan[a], half)


@njit(cache=True, error_model="numpy")
def sort_by_bucket(bucket, n_buckets, order, rank):
    """Stable counting sort of one row of buckets (N,) ints in [0, n_buckets): order (N,)
    gets the positions by (bucket, position), rank (N,) its inverse. O(N + n_buckets)."""
    start = np.zeros(n_buckets + 1, dtype=np.int64)
    for j in range(bucket.size):
        start[bucket[j] + 1] += 1                                  # bucket sizes
    for b in range(n_buckets):
        start[b + 1] += start[b]                                   # where each bucket starts
    for j in range(bucket.size):                                   # increasing j: stable
        b = bucket[j]
        order[start[b]] = j
        rank[j] = start[b]
        start[b] += 1


@njit(cache=True, error_model="numpy")
def has_other_into(order, c, causal, out):
    """out[i] |= whether position i sees a key other than itself in the round whose sorted
    positions are ``order`` (N,): a window (its chunk and the one before) of two or more
    positions, or, causal, one holding a position below i."""
    n = order.size
    none = np.iinfo(order.dtype).max                               # above every position
    previous_low = none                                            # no chunk before the first
    for mid in range(0, n, c):
        end = min(mid + c, n)
        low = none
        for a in range(mid, end):
            low = min(low, order[a])
        window_low = min(low, previous_low)                        # the window's least position
        window = end - max(mid - c, 0)                             # the window's size
        for a in range(mid, end):
            i = order[a]
            if (window_low < i) if causal else (window > 1):
                out[i] = True
        previous_low = low


@njit(parallel=True, cache=True, error_model="numpy")
def _sort(bucket, n_buckets, c, causal, length, order, rank, has_other):
    """Every round's sort and has_other for bucket (H, R, N), one row a unit; length (R,):
    the real positions, sorted first, that has_other reads."""
    n_hashes, rows, _ = bucket.shape
    for r in prange(rows):
        has_other[r] = False
        for h in range(n_hashes):
            sort_by_bucket(bucket[h, r], n_buckets, order[h, r], rank[h, r])
            has_other_into(order[h, r, :length[r]], c, causal, has_other[r])


def hashing(k, *, n_hashes, chunk_size, n_buckets, causal, seed, key_mask=None):
    """Every round's sort and who sees another key, for k (R, N, D) the unit keys, as rows;
    key_mask (R, N), optional, True for a real position: padded ones are sorted last.

    Returns
    -------
    order : ndarray of int64, shape (n_hashes, R, N)
        The positions sorted by (bucket, position), round by round.
    rank : ndarray of int64, shape (n_hashes, R, N)
        Where each position sits in ``order``; its chunk is rank // chunk_size.
    has_other : ndarray of bool, shape (R, N)
        Whether position i sees a key other than itself in some round (padded: False).

    The rotations are ``forms.lsh.rotations`` (one seed, shared by the rows), cast to k's
    dtype. Cost: O(n_hashes N (D n_buckets + n_buckets)) time, O(n_hashes N) memory.
    """
    rows, n, d = k.shape
    if n_buckets is None:
        n_buckets = lsh.default_n_buckets(n, chunk_size)
    rotations = lsh.rotations(d, n_hashes=n_hashes, n_buckets=n_buckets, seed=seed)
    rotations_t = np.ascontiguousarray(rotations.astype(k.dtype).swapaxes(1, 2))  # (H, B/2, D)
    bucket = np.empty((n_hashes, rows, n), dtype=np.int64)
    buckets(k, rotations_t, bucket)
    length = np.full(rows, n, dtype=np.int64)
    if key_mask is not None:
        bucket[:, ~key_mask] = n_buckets                           # a bucket of their own
        length = key_mask.sum(axis=-1, dtype=np.int64)
    order, rank = np.empty_like(bucket), np.empty_like(bucket)
    has_other = np.empty((rows, n), dtype=np.bool_)
    _sort(bucket, n_buckets + 1, chunk_size, causal, length, order, rank, has_other)
    return order, rank, has_other
