"""``method="chunked"`` on the Numba backend: causal linear attention and its backward in
blocks of C = ``chunk_size`` positions, each block's work done by matrix products (BLAS,
called from the compiled loops), Eq. (9)-(15) of Katharopoulos et al. (2020),
arXiv:2006.16236.

With phi_q, phi_k (C, D) a block's features, v1 = [v, 1] (C, M + 1) its values with the
normaliser's column of ones, and S (D, M + 1) the state entering the block,
    num = phi_q S + tril(phi_q phi_k^T) v1,   out = num[:, :M] / (num[:, M] + eps)   Eq. (9-12)
    S  <- S + phi_k^T v1.
The backward is two sweeps (section 3.3.1, Eq. 13-15), each with one state:
- forward in time, the same S, without the block's out: g_i = S_i dout_i comes from
  g = dout1 S^T + tril(dout1 v1^T) phi_k with dout1 = [dout, 0], and den_i from a running z;
  then dden = -phi_q . g / den^2 = -dout . out / den and dphi_q = g / den + dden z; den and
  dden are kept for the next sweep (2 numbers a position, not the M + 1 of dnum1);
- backward in time, with dnum1 = [dout / den, dden] and U = sum over later blocks of
  phi_q^T dnum1 (D, M + 1):
  dphi_k = v1 U^T + triu(v1 dnum1^T) phi_q  and  dv = (phi_k U + triu(phi_k phi_q^T) dnum1)[:, :M].
Per position the forward and the first backward sweep cost 2 C (D + M) + 4 D M flops each
against the loops' 4 D M, the second sweep 4 C (D + M) + 6 D M, but nearly all of it runs
in BLAS near the machine's peak. With ``elu`` the kernels take the raw q, k and apply
elu+1 (Eq. 7) and its derivative to each block as they load it (``elu``).

Work is split into rows x segments units: each unit carries the state through its blocks
in cache. When the rows (batch x heads) do not share out evenly over the threads, each row
is cut into segments, and each segment's unit first sums the increments of the positions
before it (phi_k^T v1 in the longest products BLAS keeps on one thread, no readout), so units
never wait for one another.
Non-causal attention is S = phi_k^T [v, 1] and out = phi_q S: NumPy's own form
(``forms.cumulative``) already runs it as two matrix products on all of BLAS's threads.
Oracle: ``forms.quadratic``; ``loops`` computes the same sums without blocks.
"""
import math

import numba
import numpy as np
from numba import njit, prange

from ..forms import cumulative
from ..forms.chunked import DEFAULT_CHUNK_SIZE
from . import elu as elu_map
from .normaliser import rows as as_rows

FORWARD, DQ, DKV = 0, 1, 2       # the sweeps: attention; dphi_q; dphi_k and dv (reversed)
# OpenBLAS (SciPy's, which Numba calls) gives a matrix product of m n k multiply-adds
# floor(m n k / 2^18) threads: below 2^19 it runs on the calling thread; above, its own
# threads fight the Numba threads calling it (blocks of 96 at D = M = 64 ran 3x slower).
SINGLE_THREAD_PRODUCT = 2 ** 19
# the increments before a segment, a block's worth of positions, against a block's whole
# forward work: measured (heads = 1, N = 4096, D = M = 64, 2 threads: 0.2 to 0.4 tried, 0.3
# fastest); sets the lengths of ``segments``
INCREMENT_COST = 0.3


def block_length(chunk_size, d, m):
    """Positions per block: ``chunk_size``, or fewer for wide heads, so that each of a block's
    matrix products (C x D x (M + 1), C x C x max(D, M + 1)) stays on the calling thread."""
    c, wide = chunk_size, max(d, m + 1)
    while c > 1 and max(c * d * (m + 1), c * c * wide) >= SINGLE_THREAD_PRODUCT:
        c -= 1
    return c


def segments(rows, blocks):
    """Where each row's segments start, in blocks counted in scan order, and end:
    ``bounds[s]:bounds[s + 1]`` for s < S. S is 1 when the rows share out evenly over the
    threads (8 rows on 2 threads), else enough for equal shares (2 at 1 row on 2 threads).

    Segment s first sums the increments of the b_s blocks before it (cost w each, w = 0.3 of
    a block's full work), then walks its own L_s blocks. Equal work W = w b_s + L_s for every
    s gives b_{s+1} = (1 - w) b_s + W, so the first segments are the longest; at S = 2, 10/17
    and 7/17 of the row, a (2 - w) = 1.7x speed-up over one thread at best.
    """
    threads = numba.get_num_threads()
    n_segments = threads // math.gcd(rows, threads)
    w = INCREMENT_COST
    work = blocks * w / (1 - (1 - w) ** n_segments)
    bounds = [0]
    for _ in range(n_segments - 1):
        bounds.append(min(blocks, round((1 - w) * bounds[-1] + work)))
    return np.array(bounds + [blocks], dtype=np.int64)


@njit(cache=True, error_model="numpy")
def _load(x, r, i0, i1, elu):
    """phi(x[r, i0:i1]) (C, W) if ``elu``, else those rows themselves."""
    rows = x[r, i0:i1]
    if not elu:
        return rows
    features = np.empty(rows.shape, dtype=rows.dtype)
    elu_map.phi_into(rows.reshape(rows.size), features.reshape(features.size))  # Eq. (7)
    return features


@njit(cache=True, error_model="numpy")
def _with_column(x, r, i0, i1, value):
    """[x[r, i0:i1], value]: (C, M + 1). With 1, v1 = [v, 1] carries the normaliser as one
    more value column; with 0, dout1 = [dout, 0] reads the state's values only."""
    m = x.shape[2]
    x1 = np.empty((i1 - i0, m + 1), dtype=x.dtype)
    for i in range(i0, i1):
        x1[i - i0, :m] = x[r, i]
        x1[i - i0, m] = value
    return x1


@njit(cache=True, error_model="numpy")
def _dot(x, y):
    """x . y over two 1-D arrays as four interleaved sums: without fastmath LLVM may not
    reorder a sum, and one chain of adds waits on each add's latency."""
    n4 = x.size - x.size % 4
    s0 = s1 = s2 = s3 = x.dtype.type(0)
    for j in range(0, n4, 4):
        s0 += x[j] * y[j]
        s1 += x[j + 1] * y[j + 1]
        s2 += x[j + 2] * y[j + 2]
        s3 += x[j + 3] * y[j + 3]
    for j in range(n4, x.size):
        s0 += x[j] * y[j]
    return (s0 + s1) + (s2 + s3)


@njit(cache=True, error_model="numpy")
def _masked(x, y, z, reverse):
    """tril(x y^T) z, or triu(x y^T) z if reverse: the block's own positions, (C, W)."""
    c = x.shape[0]
    scores = np.empty((c, c), dtype=x.dtype)
    np.dot(x, y.T, scores)                                 # x_i . y_j
    zero = x.dtype.type(0)
    for i in range(c):
        for j in range(i) if reverse else range(i + 1, c):
            scores[i, j] = zero                            # assigned: 0 * NaN would be NaN
    out = np.empty((c, z.shape[1]), dtype=x.dtype)
    np.dot(scores, z, out)
    return out


@njit(cache=True, error_model="numpy")
def _dnum1(dout, norms, r, i0, i1):
    """dnum1 = [dout / den, dden] (C, M + 1): the gradient with respect to num, the
    normaliser's last, from the (den, dden) pairs ``norms`` of the DQ sweep."""
    m = dout.shape[2]
    dnum1 = np.empty((i1 - i0, m + 1), dtype=dout.dtype)
    for i in range(i0, i1):
        den = norms[r, i, 0]
        for j in range(m):
            dnum1[i - i0, j] = dout[r, i, j] / den
        dnum1[i - i0, m] = norms[r, i, 1]
    return dnum1


@njit(cache=True, error_model="numpy")
def _increment(stage, x_q, x_k, v, dout, norms, r, i0, i1, elu):
    """The block's contribution to the state: phi_k^T v1, or phi_q^T dnum1 (DKV)."""
    if stage == DKV:
        return _load(x_q, r, i0, i1, elu).T @ _dnum1(dout, norms, r, i0, i1)
    return _load(x_k, r, i0, i1, elu).T @ _with_column(v, r, i0, i1, 1)


@njit(cache=True, error_model="numpy")
def _chain_elu(dphi_b, x, phi_b, elu, grad, r, i0):
    """grad = dphi_b * d phi / dx with ``elu`` (1 where x > 0, else exp(x) = phi(x)), else
    dphi_b: the block's gradient with respect to the raw rows x[r, i0:]."""
    one = grad.dtype.type(1)
    for i in range(grad.shape[0]):
        for f in range(grad.shape[1]):
            grad[i, f] = dphi_b[i, f] * (one if x[r, i0 + i, f] > 0 else phi_b[i, f]) \
                if elu else dphi_b[i, f]


@njit(cache=True, error_model="numpy")
def _forward(x_q, x_k, v, eps, elu, out, r, i0, i1, state):
    """out for the block from the state S entering it, Eq. (9)-(12):
    num = phi_q S + tril(phi_q phi_k^T) v1, its last column the normaliser phi_q_i^T z_i."""
    phi_q, phi_k = _load(x_q, r, i0, i1, elu), _load(x_k, r, i0, i1, elu)
    v1 = _with_column(v, r, i0, i1, 1)
    num = _masked(phi_q, phi_k, v1, False)
    num += phi_q @ state
    m = v.shape[2]
    for i in range(i1 - i0):
        den = num[i, m] + eps                               # phi_q_i^T z_i + eps, Eq. (12)
        for j in range(m):
            out[r, i0 + i, j] = num[i, j] / den
    return phi_k.T @ v1


@njit(cache=True, error_model="numpy")
def _dq(x_q, x_k, v, dout, eps, elu, norms, dq, r, i0, i1, state):
    """dphi_q for the block (Eq. 13 and the normaliser's part) and (den, dden) for the DKV
    sweep, without the block's out: with g_i = S_i dout_i (S_i the state after position i),
        dout_i . num_i = phi_q_i . g_i,   dden_i = -phi_q_i . g_i / den_i^2,
        dphi_q_i = g_i / den_i + dden_i z_i,
    where g = dout1 S^T + tril(dout1 v1^T) phi_k (three matrix products) and z_i,
    den_i = phi_q_i . z_i + eps come from a running sum of phi_k: recomputing out and den
    would take three products more."""
    phi_q, phi_k = _load(x_q, r, i0, i1, elu), _load(x_k, r, i0, i1, elu)
    v1, dout1 = _with_column(v, r, i0, i1, 1), _with_column(dout, r, i0, i1, 0)
    g = _masked(dout1, v1, phi_k, False)                    # the block's own keys
    g += dout1 @ state.T                                    # and earlier blocks': (C, D)
    m = v.shape[2]
    z = state[:, m].copy()
    for i in range(i1 - i0):
        z += phi_k[i]                                       # z_i, Eq. (18)
        den = _dot(phi_q[i], z) + eps                       # Eq. (12)
        dden = -_dot(phi_q[i], g[i]) / (den * den)          # the normaliser's gradient
        norms[r, i0 + i, 0], norms[r, i0 + i, 1] = den, dden
        for f in range(z.size):
            g[i, f] = g[i, f] / den + dden * z[f]           # dphi_q_i, Eq. (13)
    _chain_elu(g, x_q, phi_q, elu, dq[r, i0:i1], r, i0)
    return phi_k.T @ v1


@njit(cache=True, error_model="numpy")
def _dkv(x_q, x_k, v, dout, elu, norms, dk, dv, r, i0, i1, state):
    """dphi_k and dv for the block from U, the sum of phi_q^T dnum1 over later blocks:
    dphi_k = v1 U^T + triu(v1 dnum1^T) phi_q, dv = phi_k U + triu(phi_k phi_q^T) dnum1,
    Eq. (14)-(15); returns the block's phi_q^T dnum1."""
    phi_q, phi_k = _load(x_q, r, i0, i1, elu), _load(x_k, r, i0, i1, elu)
    v1, dnum1_b = _with_column(v, r, i0, i1, 1), _dnum1(dout, norms, r, i0, i1)
    dk_b = _masked(v1, dnum1_b, phi_q, True)                # Eq. (14), within the block
    dk_b += v1 @ state.T                                    # and from later blocks
    dv_b = _masked(phi_k, phi_q, dnum1_b, True)             # Eq. (15)
    dv_b += phi_k @ state
    _chain_elu(dk_b, x_k, phi_k, elu, dk[r, i0:i1], r, i0)
    m = v.shape[2]
    for i in range(i1 - i0):
        dv[r, i0 + i] = dv_b[i, :m]                         # the ones column has no gradient
    return phi_q.T @ dnum1_b


@njit(parallel=True, cache=True, error_model="numpy")
def sweep(stage, x_q, x_k, v, dout, eps, elu, out, norms, dq, dk, dv, block, bounds):
    """One sweep over blocks of ``block`` positions (see the module): writes ``out``
    (FORWARD), ``norms`` and ``dq`` (DQ), or ``dk`` and ``dv`` (DKV, backward in time); one
    unit per row and segment of ``bounds`` (``segments``).

    Shapes: x_q, x_k (R, N, D); v (R, N, M); dout, out (R, N, M); norms (R, N, 2);
    dq, dk (R, N, D); dv (R, N, M); arrays a sweep does not use may be empty.
    Cost: O(R N (D M + C (D + M))) time, plus O(R N D M) to start segments after the
    first; O(D M + C (C + D + M)) memory per unit, never a state per position.
    """
    rows, n, d = x_q.shape
    reverse = stage == DKV
    blocks, n_segments = -(-n // block), bounds.size - 1
    # the increments before a segment in products of up to ``group`` positions, not C
    group = max(1, (SINGLE_THREAD_PRODUCT - 1) // (d * (v.shape[2] + 1)))
    for unit in prange(rows * n_segments):
        r, s = divmod(np.int64(unit), n_segments)    # prange counts unsigned
        state = np.zeros((d, v.shape[2] + 1), dtype=v.dtype)
        # before the segment: the state only, summed over the positions of bounds[s] blocks
        lo, hi = (blocks - bounds[s]) * block, n
        if not reverse:
            lo, hi = 0, min(n, bounds[s] * block)
        for g0 in range(lo, hi, group):
            state += _increment(stage, x_q, x_k, v, dout, norms, r, g0, min(hi, g0 + group),
                                elu)
        for t in range(bounds[s], bounds[s + 1]):   # the segment's blocks in scan order
            blk = blocks - 1 - t if reverse else t
            i0, i1 = blk * block, min(n, (blk + 1) * block)
            if stage == FORWARD:
                state += _forward(x_q, x_k, v, eps, elu, out, r, i0, i1, state)
            elif stage == DQ:
                state += _dq(x_q, x_k, v, dout, eps, elu, norms, dq, r, i0, i1, state)
            else:
                state += _dkv(x_q, x_k, v, dout, elu, norms, dk, dv, r, i0, i1, state)


def _sweeps(x_q, x_k, v, chunk_size):
    """(rows of x_q, x_k, v, block length, segment bounds): what every sweep shares."""
    q, k, v_rows = as_rows(x_q), as_rows(x_k), as_rows(v)
    rows, n, d = q.shape
    block = block_length(chunk_size, d, v_rows.shape[-1])
    return q, k, v_rows, block, segments(rows, -(-n // block))


def attend(phi_q, phi_k, v, *, causal, eps, chunk_size=DEFAULT_CHUNK_SIZE,
           elu=False):
    """Normalised linear attention, Eq. (5) / (9)-(12), by blocked matrix products.
    Shapes (..., N, F), (..., N, M) -> (..., N, M); raw q, k with ``elu``.

    Cost: O(N (F M + C (F + M))) time, O(N M) memory: the output, nothing more.
    """
    if not causal:
        if elu:
            phi_q, phi_k = elu_map.features(phi_q), elu_map.features(phi_k)
        return cumulative.attend(phi_q, phi_k, v, causal=False, eps=eps)
    q, k, v_rows, block, bounds = _sweeps(phi_q, phi_k, v, chunk_size)
    out, none = np.empty_like(v_rows), np.empty((0, 0, 0), dtype=v.dtype)
    sweep(FORWARD, q, k, v_rows, none, v.dtype.type(eps), elu, out, none, none, none, none,
          block, bounds)
    return out.reshape(v.shape)


def attend_backward(dout, phi_q, phi_k, v, *, causal, eps,
                    chunk_size=DEFAULT_CHUNK_SIZE, elu=False):
    """Backward of ``attend``: (dphi_q, dphi_k, dv), or (dq, dk, dv) with ``elu``, by two
    sweeps (Eq. 13-15 and the normaliser's gradient; see the module).

    Cost: about 2.7 forwards' flops at C = 32, D = M = 64; O(N (F + M)) memory: the
    gradients and (den, dden) (N, 2).
    """
    if not causal:
        features = (elu_map.features(phi_q), elu_map.features(phi_k)) if elu else (phi_q, phi_k)
        dphi_q, dphi_k, dv = cumulative.attend_backward(dout, *features, v, causal=False,
                                                        eps=eps)
        if elu:
            dphi_q, dphi_k = elu_map.vjp_(phi_q, dphi_q), elu_map.vjp_(phi_k, dphi_k)
        return dphi_q, dphi_k, dv
    q, k, v_rows, block, bounds = _sweeps(phi_q, phi_k, v, chunk_size)
    dout_rows, eps = as_rows(dout), v.dtype.type(eps)
    norms = np.empty((*v_rows.shape[:-1], 2), dtype=v.dtype)                # (den, dden)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v_rows)
    none = np.empty((0, 0, 0), dtype=v.dtype)
    for stage in (DQ, DKV):
        sweep(stage, q, k, v_rows, dout_rows, eps, elu, none, norms, dq, dk, dv, block,
              bounds)
    return dq.reshape(phi_q.shape), dk.reshape(phi_k.shape), dv.reshape(v.shape)
