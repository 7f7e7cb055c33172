"""The element loops of one tile of softmax attention (Eq. 2 of Katharopoulos et al. (2020),
arXiv:2006.16236) for ``softmax``'s tiled kernels: everything between two matrix products.

A tile pairs the keys j0 <= j < j0 + C with the queries i0 <= i < i0 + B and is held
transposed, keys by queries, (C, B): ``St[b, a]`` is about key j0 + b and query i0 + a. Every
per-query quantity (row maximum, row sum, log-sum-exp, dout . out) then lies along the
contiguous axis, so each loop below runs over queries with no reduction across lanes, and
LLVM vectorises it without fastmath (a sum along the row would be one chain of adds). Causal
tiles set the pairs with j > i (Eq. 8) to -inf or 0; padded keys (a key mask) get the same
on their whole row (``scale_and_max_keys``, ``zero_keys``). A query that sees no key at all
keeps its maximum at -inf: its exps are taken against 0, all 0, and its sum, 0, is read as 1,
so its output is 0 and its log-sum-exp -inf (as NumPy's form gives).

The exp (``exp_nonpositive``; its arguments are logits minus a maximum, <= 0) is, for
float64, ``elu``'s vectorisable one (within 1 ulp of the C library's), and the C library's own where
Numba's private API (``_internals``) is missing. For float32 it is the
same scheme, exp(x) = 2^n exp(r) with n = round(x / ln 2) and Taylor's series to r^7, but
each multiply-add in one instruction where the CPU has FMA (``llvm.fmuladd``, which LLVM
vectorises) and no subnormal results: x below ln(least normal float) = -87.3365 gives 0.
Half the instructions of ``elu``'s, and about twice as fast on one core; within 0.93 ulp of
exp over the normal range (``tests/test_numba_softmax``). The sums of exps this feeds add
terms below 1.2e-38 to a total >= 1 (the maximum's own term), so the flushed tail changes
nothing. NaN stays NaN, -inf gives 0.

Masked stores. The running maximum is ``top[a] = np.fmax(top[a], logit)`` (a NaN logit
leaves top alone; top itself is never NaN), not ``logit if logit > top[a] else top[a]``.
Numba lowers that conditional to branches; LLVM, finding a store only where the logit is
larger, vectorises it as a masked store: one instruction with AVX-512, but AVX2's
vmaskmovps, microcoded on AMD's Zen CPUs. There the tile's maximum took 0.50 ns an element,
0.11 with ``np.fmax`` (a 256 x 256 float32 tile, one thread of a 2-core EPYC, Zen 3).
``tests/test_numba_cpu`` looks for masked moves in the compiled loops.
Oracle: ``linattn.softmax`` (NumPy), through ``softmax``'s tests.
"""
import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from .elu import LN2_HI_32, LN2_LO_32, NATIVE, TAYLOR_32, exp64, libm_exp, with_bits

try:
    from ._internals import fmuladd       # LLVM's fused multiply-add (see _internals)
except ImportError:
    fmuladd = None

LOG2_E_32 = np.float32(1 / math.log(2))
LEAST_NORMAL_LOG_32 = np.float32(-87.33654)    # ln(2^-126), rounded up: exp(x) >= 2^-126


@njit(cache=True, error_model="numpy", inline="always")   # inlined: vectorises in loops
def _exp32(x):
    """exp(x) for float32 x <= 0, 0 below -87.3365 (NaN for NaN); no call: vectorisable."""
    t = x if x > LEAST_NORMAL_LOG_32 else LEAST_NORMAL_LOG_32       # NaN: NaN again below
    n = np.floor(fmuladd(t, LOG2_E_32, np.float32(0.5)))           # round(t / ln 2)
    r = fmuladd(n, np.float32(-LN2_HI_32), t)                      # t - n ln 2, in two
    r = fmuladd(n, np.float32(-LN2_LO_32), r)                      # parts: |r| <= ln2 / 2
    p = TAYLOR_32[0]
    for coef in TAYLOR_32[1:]:
        p = fmuladd(p, r, coef)                                    # exp(r), Horner
    e = p * with_bits((np.int32(n) + 127) << 23, x)                # 2^n exp(r), normal
    e = e if x >= LEAST_NORMAL_LOG_32 else np.float32(0)
    return e if x == x else x


def exp_nonpositive(x):
    """exp(x) for x <= 0 (or NaN); compiled code gets ``_exp32`` or ``elu.exp64`` (the C
    library's exp without Numba's private API, ``_internals``)."""
    return np.exp(x)


@overload(exp_nonpositive)
def _exp_nonpositive(x):
    if not (NATIVE and fmuladd is not None):
        return lambda x: libm_exp(x)
    if x == types.float32:
        return lambda x: _exp32(x)
    if x == types.float64:
        return lambda x: exp64(x)


@njit(cache=True, error_model="numpy", inline="always")
def _first_seen(causal, i0, j0, b, n_queries):
    """The first query of the tile that sees key j0 + b: the causal mask, Eq. (8)."""
    if not causal:
        return 0
    return min(n_queries, max(0, j0 + b - i0))


@njit(cache=True, error_model="numpy")
def scale_and_max(St, scale, causal, i0, j0, top):
    """Logits L = scale S^T in place (masked pairs -inf) and top[a] = max(top[a], max_b
    L[b, a]) for each query a of the tile. A NaN logit leaves top alone and reaches the sum
    through its exp (NaN), so its row still ends NaN, as in NumPy."""
    n = St.shape[1]
    if n == 1 and not causal:                      # one query (generation): its column
        top[0] = _scale_and_max_column(St.reshape(St.size), scale, top[0])
        return
    for b in range(St.shape[0]):
        _scale_and_max_row(St, b, scale, causal, i0, j0, top)


@njit(cache=True, error_model="numpy")
def scale_and_max_keys(St, scale, causal, i0, j0, top, real_c):
    """``scale_and_max`` with padded keys: real_c (C,) is True for a real key of the tile, and
    a padded key's row is -inf (no weight in any query's softmax, whatever its logit)."""
    for b in range(St.shape[0]):
        if real_c[b]:
            _scale_and_max_row(St, b, scale, causal, i0, j0, top)
        else:
            St[b, :] = -np.inf                                 # padding: no weight


@njit(cache=True, error_model="numpy", inline="always")
def _scale_and_max_row(St, b, scale, causal, i0, j0, top):
    """Row b (key j0 + b) of ``scale_and_max``."""
    n = St.shape[1]
    first = _first_seen(causal, i0, j0, b, n)
    St[b, :first] = -np.inf                                    # j > i: no weight, Eq. (8)
    seen, top_seen = St[b, first:], top[first:n]               # sliced: indices from 0
    for a in range(seen.size):
        logit = seen[a] * scale
        seen[a] = logit
        top_seen[a] = np.fmax(top_seen[a], logit)              # no select: masked stores


@njit(cache=True, error_model="numpy")
def exp_and_sum(St, top, m, total, rescale):
    """The online softmax step: with top the new row maxima, rescale = exp(m - top) (the
    factor for what was summed under the old maxima m), m = top, total = rescale total +
    sum_b P^T[b, a], and St = P^T = exp(L - m), each entry <= 1: no overflow. A query that
    has seen only -inf so far (every key masked) keeps m = -inf, rescale 1, and its exps
    are taken against 0 (all 0): top becomes that shift."""
    n = St.shape[1]
    for a in range(n):
        if top[a] == -np.inf:                      # no key seen yet: nothing to rescale
            rescale[a] = 1
            m[a], top[a] = top[a], 0
        else:
            rescale[a] = exp_nonpositive(m[a] - top[a])    # exp(m_old - m_new)
            m[a] = top[a]
        total[a] *= rescale[a]
    if n == 1:                                     # one query: along its column
        total[0] += _exp_and_sum_column(St.reshape(St.size), top[0])
        return
    for b in range(St.shape[0]):
        row = St[b]
        for a in range(n):
            p = exp_nonpositive(row[a] - top[a])           # P^T[b, a], not yet normalised
            row[a] = p
            total[a] += p


# A tile of one query (Nq = 1, generation) has a (C, 1) S^T: the loops above would run C
# rows of one element, and nothing vectorises. Its column is contiguous, so these loop along
# it; the maximum and the sum, reductions along the loop, keep four running values (without
# fastmath LLVM may not reorder them, and one chain waits on each step's latency).
@njit(cache=True, error_model="numpy")
def _scale_and_max_column(col, scale, best):
    """col *= scale in place; returns max(best, max col), NaN entries left aside."""
    for b in range(col.size):
        col[b] *= scale
    t0 = t1 = t2 = t3 = best
    n4 = col.size - col.size % 4
    for b in range(0, n4, 4):
        t0 = col[b] if col[b] > t0 else t0
        t1 = col[b + 1] if col[b + 1] > t1 else t1
        t2 = col[b + 2] if col[b + 2] > t2 else t2
        t3 = col[b + 3] if col[b + 3] > t3 else t3
    for b in range(n4, col.size):
        t0 = col[b] if col[b] > t0 else t0
    t0 = t1 if t1 > t0 else t0
    t2 = t3 if t3 > t2 else t2
    return t2 if t2 > t0 else t0


@njit(cache=True, error_model="numpy")
def _exp_and_sum_column(col, m):
    """col = exp(col - m) in place; returns its sum."""
    for b in range(col.size):
        col[b] = exp_nonpositive(col[b] - m)
    s0 = s1 = s2 = s3 = col.dtype.type(0)
    n4 = col.size - col.size % 4
    for b in range(0, n4, 4):
        s0 += col[b]
        s1 += col[b + 1]
        s2 += col[b + 2]
        s3 += col[b + 3]
    for b in range(n4, col.size):
        s0 += col[b]
    return (s0 + s1) + (s2 + s3)


@njit(cache=True, error_model="numpy")
def transpose_into(x, flat):
    """x^T (W, n) for a (n, W) block x, written C-ordered into the front of the 1-D scratch
    ``flat`` and returned: the operand layout OpenBLAS multiplies fastest (see ``softmax``)."""
    n, w = x.shape
    xt = flat[:w * n].reshape(w, n)
    for c in range(w):
        for a in range(n):
            xt[c, a] = x[a, c]
    return xt


@njit(cache=True, error_model="numpy")
def scale_rows(out_b, factor):
    """out_b[a] *= factor[a] for each row of (B, M) out_b; rows with factor 1 (the maximum
    did not move) are left alone."""
    for a in range(out_b.shape[0]):
        f = factor[a]
        if f != 1:                                 # NaN included
            for c in range(out_b.shape[1]):
                out_b[a, c] *= f


@njit(cache=True, error_model="numpy")
def finish_rows(out_b, m, total, lse_b):
    """out_b[a] /= total[a] (Eq. 2's denominator) and the log-sum-exp of the logits,
    lse_b[a] = m[a] + log(total[a]), which the backward rebuilds P from. A total of 0 (a
    query with every key padded; otherwise the maximum's own term makes it >= 1) is read as
    1: out 0, lse = m = -inf."""
    for a in range(out_b.shape[0]):
        t = total[a] if total[a] != 0 else total.dtype.type(1)
        for c in range(out_b.shape[1]):
            out_b[a, c] /= t
        lse_b[a] = m[a] + np.log(t)


@njit(cache=True, error_model="numpy")
def row_dots(x, y, result):
    """result[a] = x[a] . y[a] over the rows of two (B, M) arrays: dout_i . out_i =
    rowsum(dP * P)_i, the backward's D_i."""
    for a in range(x.shape[0]):
        s = x.dtype.type(0)
        for c in range(x.shape[1]):
            s += x[a, c] * y[a, c]
        result[a] = s


@njit(cache=True, error_model="numpy")
def probabilities_t(St, scale, causal, i0, j0, lse_b):
    """P^T = exp(scale S^T - lse_b) in place: the forward's probabilities rebuilt from its
    log-sum-exp (lse_b, the tile's queries'), masked pairs exactly 0."""
    n = St.shape[1]
    for b in range(St.shape[0]):
        first = _first_seen(causal, i0, j0, b, n)
        St[b, :first] = 0                                      # j > i, Eq. (8)
        seen, lse_seen = St[b, first:], lse_b[first:]          # sliced: indices from 0
        for a in range(seen.size):
            seen[a] = exp_nonpositive(seen[a] * scale - lse_seen[a])


@njit(cache=True, error_model="numpy")
def zero_keys(Pt, real_c):
    """The rows of padded keys (real_c (C,) False) of a (C, B) tile set to exactly 0: no
    probability (after ``probabilities_t``), no gradient (after ``dlogits_t``)."""
    for b in range(Pt.shape[0]):
        if not real_c[b]:
            Pt[b, :] = 0


@njit(cache=True, error_model="numpy")
def dlogits_t(Pt, dPt, delta_b, scale, causal, i0, j0):
    """Pt <- scale dL^T = scale P^T * (dP^T - D) in place, with D = delta_b the tile's
    queries' dout . out = rowsum(dP * P): the softmax's backward, scaled for dq and dk.
    Masked pairs stay 0 (not 0 * (dP - D), NaN when a query's D is)."""
    n = Pt.shape[1]
    for b in range(Pt.shape[0]):
        first = _first_seen(causal, i0, j0, b, n)
        p_seen, dp_seen, delta_seen = Pt[b, first:], dPt[b, first:], delta_b[first:]
        for a in range(p_seen.size):
            p_seen[a] = p_seen[a] * (dp_seen[a] - delta_seen[a]) * scale
