"""``method="chunked"`` on the Numba backend: causal linear attention and its backward in
blocks of C = ``chunk_size`` positions, each block's work done by matrix products (BLAS,
called from the compiled loops), Eq. (9)-(15) of Katharopoulos et al. (2020),
arXiv:2006.16236.

With phi_q, phi_k (C, D) and v (C, M) a block's features and values, and (S, z) = (sum of
phi_k_j v_j^T, sum of phi_k_j) (D, M), (D,) over the positions before the block:
    out = (phi_q S + A v) / den,   A = tril(phi_q phi_k^T),             Eq. (9)-(12)
    den_i = phi_q_i . z + sum_j A_ij + eps,   S <- S + phi_k^T v,  z <- z + sum_i phi_k_i.
The backward is two sweeps (section 3.3.1, Eq. 13-15), each with one state:
- forward in time, the same (S, z), without the block's out: g_i = S_i dout_i comes from
  g = dout S^T + tril(dout v^T) phi_k, den_i from a running z; then
  dden = -phi_q . g / den^2 = -dout . out / den and dphi_q = g / den + dden z; den and dden
  are kept for the next sweep (2 numbers a position);
- backward in time, with dnum = dout / den and (U, u) = sums over later blocks of
  phi_q^T dnum (D, M) and phi_q^T dden (D,):
  dphi_k = v U^T + u + triu(v dnum^T + dden) phi_q  and  dv = phi_k U + triu(phi_k phi_q^T) dnum.
Per position the forward and the first backward sweep cost 2 C (D + M) + 4 D M flops each
against the loops' 4 D M, the second sweep 4 C (D + M) + 6 D M; nearly all of it runs in
BLAS, which adds each product into the array that holds the sum (``blas.gemm``): no
temporaries. With ``elu`` the kernels take the raw q, k and apply elu+1 (Eq. 7) and its
derivative to each block as they load it (``elu``).

Work is split into rows x segments units: each unit carries the state through its blocks
in cache. When the rows (batch x heads) do not share out evenly over the threads, each row
is cut into segments, and each segment's unit first sums the increments of the positions
before it (phi_k^T v in the longest products BLAS keeps on one thread, no readout), so units
never wait for one another.
Key padding and states (``padding``): padded keys are dropped before the sweeps; every
unit's (S, z) starts from a state handed over, [S0, z0] (Eq. 20), and every (U, u) from the
final state's gradient [dS, dz] (it reaches each key as dS v_j + dz, each value as
dS^T phi_k_j); the unit ending a row's scan writes out the final state, or [dS0, dz0].
Non-causal attention, Eq. (5)-(6), takes the same sweeps with every block reading the
state of the whole row: out = phi_q S / (phi_q z + eps), and in the backward
dphi_q = g / den + dden z with g = dout S^T, then dphi_k = v U^T + u and dv = phi_k U with
(U, u) summed over the row. Each unit sums the whole row's state itself, so the segments of a
row are equal.
Oracle: ``forms.quadratic``; ``loops`` computes the same sums without blocks.
"""
import math

import numba
import numpy as np
from numba import njit, prange

from . import blas_threads
from .blas import gemm
from .block_ops import accumulate, chain_elu, dot, load, masked
from .padding import NONE, drop_padded, start_rows, state_of, zero_padded
from .._checks import rows as as_rows
from ..feature_maps import EluPlusOne

FUSED_FEATURE_MAPS = (EluPlusOne,)  # applied by the kernel itself to raw q, k (elu=True)
# options taken by keyword (dispatch)
SUPPORTS = frozenset({"non_causal", "key_mask", "initial_state", "return_state"})

FORWARD, DQ, DKV = 0, 1, 2       # the sweeps: attention; dphi_q; dphi_k and dv (reversed)
# C: the fastest of the sizes tried at the benchmark's shape (D = M = 64, 8 heads), forward
# + backward; the time is flat near it (docs/performance.md has the benchmark's machine).
# With OpenBLAS's Haswell kernel its small products cost more per call: 32 was 10% faster
# there (forward and backward, causal, N = 4096, 2 threads) and 2-5% slower with the SkylakeX
# kernel, on a Xeon whose OpenBLAS ran either kernel. ``default_chunk_size`` takes 32 with
# the kernels of ``blas_threads.LARGE_PRODUCT_KERNELS`` (Haswell's and Zen's); the products
# of blocks of 32 stay under the threading threshold, so nothing is held.
DEFAULT_CHUNK_SIZE = 16
LARGE_PRODUCT_CHUNK_SIZE = 32
# OpenBLAS (SciPy's, which Numba calls) gives a matrix product of m n k multiply-adds
# floor(m n k / 2^18) threads: below 2^19 it runs on the calling thread; above, its own
# threads fight the Numba threads calling it (larger blocks ran several times slower).
SINGLE_THREAD_PRODUCT = 2 ** 19
# the increments before a segment, a block's worth of positions, against a block's whole
# forward work: the value of those tried at which one row on two threads ran its forward
# fastest (forward + backward nearly as fast); sets the lengths of ``segments``
INCREMENT_COST = 0.3


def block_length(chunk_size, d, m):
    """Positions per block: ``chunk_size``, or fewer for wide heads, so that each of a block's
    matrix products (C x D x M, C x C x max(D, M)) stays on the calling thread."""
    c, wide = chunk_size, max(d, m)
    while c > 1 and max(c * d * m, c * c * wide) >= SINGLE_THREAD_PRODUCT:
        c -= 1
    return c


def segments(rows, blocks, causal=True):
    """Where each row's segments start, in blocks counted in scan order, and end:
    ``bounds[s]:bounds[s + 1]`` for s < S. S is 1 when the rows share out evenly over the
    threads (8 rows on 2 threads), else enough for equal shares (2 at 1 row on 2 threads).
    Not ``causal``, every segment sums the whole row first: equal lengths.

    Segment s first sums the increments of the b_s blocks before it (cost w each, w = 0.3 of
    a block's full work), then walks its own L_s blocks. Equal work W = w b_s + L_s for every
    s gives b_{s+1} = (1 - w) b_s + W, so the first segments are the longest; at S = 2, 10/17
    and 7/17 of the row, a (2 - w) = 1.7x speed-up over one thread at best.
    """
    threads = numba.get_num_threads()
    n_segments = threads // math.gcd(rows, threads)
    if not causal:
        return np.array([blocks * s // n_segments for s in range(n_segments + 1)],
                        dtype=np.int64)
    w = INCREMENT_COST
    work = blocks * w / (1 - (1 - w) ** n_segments)
    bounds = [0]
    for _ in range(n_segments - 1):
        bounds.append(min(blocks, round((1 - w) * bounds[-1] + work)))
    return np.array(bounds + [blocks], dtype=np.int64)


@njit(cache=True, error_model="numpy")
def _dnum(dout, norms, r, i0, i1):
    """(dout / den (C, M), dden (C,)): the gradients with respect to the numerator and the
    normaliser, from the (den, dden) pairs ``norms`` of the DQ sweep."""
    dout_b = dout[r, i0:i1]
    dnum = np.empty(dout_b.shape, dtype=dout.dtype)
    for i in range(i1 - i0):
        den = norms[r, i0 + i, 0]
        for j in range(dout_b.shape[1]):
            dnum[i, j] = dout_b[i, j] / den
    return dnum, norms[r, i0:i1, 1].copy()


@njit(cache=True, error_model="numpy")
def _increment(stage, x_q, x_k, v, dout, norms, r, i0, i1, elu, S, z):
    """Add the positions' contribution to the state: phi_k^T v and phi_k^T 1, or
    phi_q^T dnum and phi_q^T dden (DKV)."""
    if stage == DKV:
        dnum, dden = _dnum(dout, norms, r, i0, i1)
        accumulate(load(x_q, r, i0, i1, elu), dnum, dden, S, z)
    else:
        accumulate(load(x_k, r, i0, i1, elu), v[r, i0:i1], np.ones(i1 - i0, v.dtype), S, z)


@njit(cache=True, error_model="numpy")
def _global_forward(x_q, eps, elu, out, r, i0, i1, S, z):
    """Non-causal out for the block from (S, z) summed over the whole row, Eq. (5)-(6):
    out_i = phi_q_i^T S / (phi_q_i . z + eps)."""
    phi_q, out_b = load(x_q, r, i0, i1, elu), out[r, i0:i1]
    gemm(phi_q, S, out_b, 0)
    for i in range(i1 - i0):
        den = dot(phi_q[i], z) + eps
        for j in range(out_b.shape[1]):
            out_b[i, j] /= den


@njit(cache=True, error_model="numpy")
def _forward(x_q, x_k, v, eps, elu, out, r, i0, i1, S, z):
    """out for the block from the state (S, z) entering it, Eq. (9)-(12), and the state
    after it: out_i = (phi_q_i^T S + sum_{j <= i} (phi_q_i . phi_k_j) v_j) / den_i with
    den_i = phi_q_i^T z + sum_{j <= i} phi_q_i . phi_k_j + eps."""
    phi_q, phi_k = load(x_q, r, i0, i1, elu), load(x_k, r, i0, i1, elu)
    v_b, out_b = v[r, i0:i1], out[r, i0:i1]
    scores = masked(phi_q, phi_k, False)                   # A: the block's own keys
    gemm(phi_q, S, out_b, 0)                                # earlier blocks': (C, M)
    gemm(scores, v_b, out_b, 1)                             # + A v
    for i in range(i1 - i0):
        den = dot(phi_q[i], z) + eps                       # Eq. (12)
        for j in range(i + 1):
            den += scores[i, j]
        for j in range(out_b.shape[1]):
            out_b[i, j] /= den
    accumulate(phi_k, v_b, np.ones(i1 - i0, v.dtype), S, z)


@njit(cache=True, error_model="numpy")
def _dq(x_q, x_k, v, dout, eps, elu, norms, dq, r, i0, i1, S, z):
    """dphi_q for the block (Eq. 13 and the normaliser's part) and (den, dden) for the DKV
    sweep, without the block's out: with g_i = S_i dout_i (S_i the state after position i),
        dout_i . num_i = phi_q_i . g_i,   dden_i = -phi_q_i . g_i / den_i^2,
        dphi_q_i = g_i / den_i + dden_i z_i,
    where g = dout S^T + tril(dout v^T) phi_k (three matrix products) and z_i,
    den_i = phi_q_i . z_i + eps come from a running sum of phi_k: recomputing out and den
    would take three products more."""
    phi_q, phi_k = load(x_q, r, i0, i1, elu), load(x_k, r, i0, i1, elu)
    v_b, dout_b = v[r, i0:i1], dout[r, i0:i1]
    g = dq[r, i0:i1]                                        # dphi_q, then dq, in place
    gemm(dout_b, S.T, g, 0)                                 # earlier blocks': (C, D)
    gemm(masked(dout_b, v_b, False), phi_k, g, 1)          # and the block's own keys
    _dq_rows(phi_q, phi_k, True, g, z, eps, norms, r, i0)
    chain_elu(g, phi_q, elu)
    gemm(phi_k.T, v_b, S, 1)                                # z is already summed


@njit(cache=True, error_model="numpy")
def _global_dq(x_q, dout, eps, elu, norms, dq, r, i0, i1, S, z):
    """Non-causal dphi_q for the block and its (den, dden), as ``_dq`` with (S, z) summed
    over the whole row: g_i = S dout_i, no block of its own."""
    phi_q, g = load(x_q, r, i0, i1, elu), dq[r, i0:i1]
    gemm(dout[r, i0:i1], S.T, g, 0)
    _dq_rows(phi_q, phi_q, False, g, z, eps, norms, r, i0)
    chain_elu(g, phi_q, elu)


@njit(cache=True, error_model="numpy")
def _dq_rows(phi_q, phi_k, running, g, z, eps, norms, r, i0):
    """Each position i of the block, g_i = S_i dout_i given: den_i, dden_i into ``norms``
    and g_i <- dphi_q_i; with ``running``, z += phi_k_i first (z_i, Eq. 18)."""
    for i in range(g.shape[0]):
        if running:
            z += phi_k[i]
        den = dot(phi_q[i], z) + eps                       # Eq. (12)
        dden = -dot(phi_q[i], g[i]) / (den * den)          # the normaliser's gradient
        norms[r, i0 + i, 0], norms[r, i0 + i, 1] = den, dden
        for f in range(z.size):
            g[i, f] = g[i, f] / den + dden * z[f]           # dphi_q_i, Eq. (13)


@njit(cache=True, error_model="numpy")
def _dkv(x_q, x_k, v, dout, elu, norms, dk, dv, r, i0, i1, U, u):
    """dphi_k and dv for the block from (U, u), the sums of phi_q^T dnum and phi_q^T dden over
    later blocks, Eq. (14)-(15) with the normaliser's gradient:
        dphi_k_i = U v_i + u + sum_{j >= i} (v_i . dnum_j + dden_j) phi_q_j,
        dv_i = U^T phi_k_i + sum_{j >= i} (phi_k_i . phi_q_j) dnum_j;
    then adds the block's phi_q^T dnum and phi_q^T dden to (U, u)."""
    phi_q, phi_k = load(x_q, r, i0, i1, elu), load(x_k, r, i0, i1, elu)
    v_b, dv_b = v[r, i0:i1], dv[r, i0:i1]
    dnum, dden = _dnum(dout, norms, r, i0, i1)
    scores = masked(v_b, dnum, True)                       # v_i . dnum_j, j >= i
    for i in range(i1 - i0):
        for j in range(i, i1 - i0):
            scores[i, j] += dden[j]                         # the normaliser's column
    dk_b = dk[r, i0:i1]                                     # dphi_k, then dk, in place
    _from_state(phi_k, v_b, U, u, dk_b, dv_b)               # Eq. (14)-(15): later blocks
    gemm(scores, phi_q, dk_b, 1)                            # and the block's own
    gemm(masked(phi_k, phi_q, True), dnum, dv_b, 1)
    chain_elu(dk_b, phi_k, elu)
    accumulate(phi_q, dnum, dden, U, u)


@njit(cache=True, error_model="numpy")
def _global_dkv(x_k, v, elu, dk, dv, r, i0, i1, U, u):
    """Non-causal dphi_k and dv for the block, (U, u) summed over the whole row:
    dphi_k_i = U v_i + u and dv_i = U^T phi_k_i, Eq. (14)-(15) without a mask."""
    phi_k, dk_b = load(x_k, r, i0, i1, elu), dk[r, i0:i1]
    _from_state(phi_k, v[r, i0:i1], U, u, dk_b, dv[r, i0:i1])
    chain_elu(dk_b, phi_k, elu)


@njit(cache=True, error_model="numpy")
def _from_state(phi_k, v_b, U, u, dk_b, dv_b):
    """dk_b = v_b U^T + u and dv_b = phi_k U: the gradients the state (U, u) carries."""
    gemm(v_b, U.T, dk_b, 0)
    for i in range(dk_b.shape[0]):
        dk_b[i] += u                                        # the normaliser's
    gemm(phi_k, U, dv_b, 0)


@njit(parallel=True, cache=True, error_model="numpy")
def sweep(stage, causal, x_q, x_k, v, dout, eps, elu, out, norms, dq, dk, dv, block, bounds,
          start, final):
    """One sweep over blocks of ``block`` positions (see the module): writes ``out``
    (FORWARD), ``norms`` and ``dq`` (DQ), or ``dk`` and ``dv`` (DKV, backward in time); one
    unit per row and segment of ``bounds`` (``segments``). Not ``causal``, every unit first
    sums the state of the whole row, and each block reads it. Every unit's state starts from
    ``start`` [S, z] (R, D, M + 1), and the row's last unit writes its state to ``final``
    (R, D, M + 1); either may be empty (0, 0, 0): zeros, and nothing written.

    Shapes: x_q (R, Nq, D), x_k (R, Nk, D); v (R, Nk, M); dout, out (R, Nq, M); norms
    (R, Nq, 2); dq (R, Nq, D), dk (R, Nk, D); dv (R, Nk, M); Nq == Nk when causal; arrays a
    sweep does not use may be empty. ``bounds`` cuts the blocks of the positions it walks.
    Cost: O(R N (D M + C (D + M))) time, plus O(R N D M) to start segments after the
    first; O(D M + C (C + D + M)) memory per unit, never a state per position.
    """
    rows, d, m = x_q.shape[0], x_q.shape[2], v.shape[2]
    reverse = stage == DKV
    # blocks walk the queries (FORWARD, DQ) or the keys (DKV); the state sums the other side.
    # Causal, both are the one sequence; not causal, they may differ (cross-attention).
    n_q, n_k = x_q.shape[1], x_k.shape[1]
    n, n_state = (n_k, n_q) if reverse else (n_q, n_k)
    blocks, n_segments = -(-n // block), bounds.size - 1
    # the increments before a segment in products of up to ``group`` positions, not C
    group = max(1, (SINGLE_THREAD_PRODUCT - 1) // max(1, d * m))
    for unit in prange(rows * n_segments):
        r, s = divmod(np.int64(unit), n_segments)    # prange counts unsigned
        S, z = np.zeros((d, m), dtype=v.dtype), np.zeros(d, dtype=v.dtype)
        if start.shape[0] > 0:                       # a state handed over, Eq. (20)
            S[:] = start[r, :, :m]
            z[:] = start[r, :, m]
        # before the segment: the state only, summed over the positions of bounds[s] blocks
        # (not causal: over the whole row)
        lo, hi = (blocks - bounds[s]) * block, n
        if not causal:
            lo, hi = 0, n_state
        elif not reverse:
            lo, hi = 0, min(n, bounds[s] * block)
        for g0 in range(lo, hi, group):
            _increment(stage, x_q, x_k, v, dout, norms, r, g0, min(hi, g0 + group), elu, S, z)
        for t in range(bounds[s], bounds[s + 1]):   # the segment's blocks in scan order
            blk = blocks - 1 - t if reverse else t
            i0, i1 = blk * block, min(n, (blk + 1) * block)
            if not causal:
                if stage == FORWARD:
                    _global_forward(x_q, eps, elu, out, r, i0, i1, S, z)
                elif stage == DQ:
                    _global_dq(x_q, dout, eps, elu, norms, dq, r, i0, i1, S, z)
                else:
                    _global_dkv(x_k, v, elu, dk, dv, r, i0, i1, S, z)
            elif stage == FORWARD:
                _forward(x_q, x_k, v, eps, elu, out, r, i0, i1, S, z)
            elif stage == DQ:
                _dq(x_q, x_k, v, dout, eps, elu, norms, dq, r, i0, i1, S, z)
            else:
                _dkv(x_q, x_k, v, dout, elu, norms, dk, dv, r, i0, i1, S, z)
        if final.shape[0] > 0 and s == n_segments - 1:   # the row's scan ends here
            final[r, :, :m] = S
            final[r, :, m] = z


def default_chunk_size():
    """C when the caller gives none: LARGE_PRODUCT_CHUNK_SIZE where SciPy's BLAS kernel
    favours larger products (``blas_threads.large_products``), else DEFAULT_CHUNK_SIZE."""
    return LARGE_PRODUCT_CHUNK_SIZE if blas_threads.large_products() else DEFAULT_CHUNK_SIZE


def _sweeps(x_q, x_k, v, chunk_size):
    """(rows of x_q, x_k, v, block length): what every sweep shares."""
    q, k, v_rows = as_rows(x_q), as_rows(x_k), as_rows(v)
    chunk_size = chunk_size or default_chunk_size()
    return q, k, v_rows, block_length(chunk_size, q.shape[-1], v_rows.shape[-1])


def _new_state(q, v):
    """An uninitialised [S, z] (R, F, M + 1) for rows q (R, N, F) and values v (..., M)."""
    return np.empty((q.shape[0], q.shape[-1], v.shape[-1] + 1), dtype=v.dtype)


def _bounds(x, block, causal):
    """The segment bounds of a sweep whose blocks walk the positions of ``x`` (R, N, W)."""
    return segments(x.shape[0], -(-x.shape[1] // block), causal)


def attend(phi_q, phi_k, v, *, causal, eps, chunk_size=None,
           elu=False, key_mask=None, initial_state=None, return_state=False):
    """Normalised linear attention, Eq. (5) / (9)-(12), by blocked matrix products.
    Shapes (..., Nq, F), (..., Nk, F), (..., Nk, M) -> (..., Nq, M); raw q, k with ``elu``.
    Options as in ``linear_attention`` (``chunk_size`` None: ``default_chunk_size()``); with
    ``return_state``, ``(out, State)``.

    Cost: O(N (F M + C (F + M))) time, O(N M) memory: the output, nothing more.
    """
    phi_k, v = drop_padded(phi_k, v, key_mask, elu)
    q, k, v_rows, block = _sweeps(phi_q, phi_k, v, chunk_size)
    out = np.empty((*q.shape[:-1], v.shape[-1]), dtype=v.dtype)          # (R, Nq, M)
    none = NONE.astype(v.dtype)
    final = _new_state(q, v) if return_state else none
    sweep(FORWARD, causal, q, k, v_rows, none, v.dtype.type(eps), elu, out, none, none, none,
          none, block, _bounds(q, block, causal), start_rows(initial_state, v.dtype), final)
    out = out.reshape((*phi_q.shape[:-1], v.shape[-1]))
    return (out, state_of(final, v.shape[:-2])) if return_state else out


def attend_backward(dout, phi_q, phi_k, v, *, causal, eps,
                    chunk_size=None, elu=False, key_mask=None,
                    initial_state=None, dstate=None):
    """Backward of ``attend``: (dphi_q, dphi_k, dv), or (dq, dk, dv) with ``elu``, by two
    sweeps (Eq. 13-15 and the normaliser's gradient; see the module), then State(dS0, dz0)
    when ``initial_state`` is given. Padded keys get exactly 0.

    Cost: about 2.6 forwards' flops at C = 16, D = M = 64; O(N (F + M)) memory: the
    gradients and (den, dden) (N, 2).
    """
    phi_k, v = drop_padded(phi_k, v, key_mask, elu)
    q, k, v_rows, block = _sweeps(phi_q, phi_k, v, chunk_size)
    dout_rows, eps = as_rows(dout), v.dtype.type(eps)
    norms = np.empty((*q.shape[:-1], 2), dtype=v.dtype)                     # (den, dden)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v_rows)
    none = NONE.astype(v.dtype)
    ds1 = none if initial_state is None else _new_state(q, v)       # [dS0, dz0]
    for stage, walked, start, final in (
            (DQ, q, start_rows(initial_state, v.dtype), none),      # from [S0, z0]
            (DKV, k, start_rows(dstate, v.dtype), ds1)):             # from [dS, dz]
        sweep(stage, causal, q, k, v_rows, dout_rows, eps, elu, none, norms, dq, dk, dv,
              block, _bounds(walked, block, causal), start, final)
    dk, dv = zero_padded(key_mask, dk.reshape(phi_k.shape), dv.reshape(v.shape))
    grads = (dq.reshape(phi_q.shape), dk, dv)
    return grads if initial_state is None else (*grads, state_of(ds1, v.shape[:-2]))
