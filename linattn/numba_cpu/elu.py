"""The paper's feature map, phi(x) = elu(x) + 1 (Eq. 7 of Katharopoulos et al. (2020),
arXiv:2006.16236), and its derivative, as compiled element functions that the Numba kernels
apply to blocks of q and k as they load them (no array of features is ever made).

phi(x) = x + 1 for x > 0 and exp(x) otherwise. Numba calls the C library's exp one element at
a time (~6 ns each here, ten times NumPy's SIMD exp), so ``exp32`` and ``exp64`` compute
exp(x), x <= 0, with arithmetic the compiler vectorises:
    exp(x) = 2^n exp(r),  n = round(x / ln 2),  r = x - n ln 2 in [-ln2/2, ln2/2],
with ln 2 split in two parts (the high part has few bits, so n ln2_hi is exact), exp(r) by
its Taylor series to r^7 (float32) or r^13 (float64), whose remainder is below half an ulp
on that interval, and 2^n written straight into a float's exponent bits (``with_bits``; a
table lookup would be a gather, twice as slow; without Numba's private API, ``_internals``,
the C library's exp is used instead). Measured against exp in float64: within 1 ulp
(float64) and 1.21 ulp (float32) over the whole range; NaN stays NaN, -inf gives 0.
``phi`` is what kernels call, and for the chain rule ``dphi_from_phi`` (from the features
they hold) or ``dphi``; ``phi_into``, ``features`` and ``vjp_`` apply them to arrays.
Oracle: ``feature_maps.EluPlusOne`` (NumPy).
"""
import decimal
import math

import numpy as np
from numba import njit, types
from numba.extending import overload

try:
    from ._internals import with_bits     # LLVM IR (see _internals)
except ImportError:
    with_bits = None
NATIVE = with_bits is not None      # else exp is the C library's (libm_exp)

# ln 2 = hi + lo: hi keeps few bits, so n * hi is exact for every n used (|n| <= 1075), and
# lo is the rest of ln 2 to 60 digits, rounded once; float32 uses a shorter hi
LN2 = decimal.Context(prec=60).ln(2)
LN2_HI_64 = float.fromhex("0x1.62e42fee00000p-1")     # ln 2 to 32 bits
LN2_HI_32 = float.fromhex("0x1.630p-1")               # ln 2 to 9 bits, 0.693359375
LN2_LO_64 = float(LN2 - decimal.Decimal(LN2_HI_64))
LN2_LO_32 = float(LN2 - decimal.Decimal(LN2_HI_32))
# Taylor coefficients 1/k!, highest first (Horner)
TAYLOR_64 = tuple(1 / math.factorial(k) for k in range(13, -1, -1))
TAYLOR_32 = tuple(np.float32(c) for c in TAYLOR_64[-8:])


@njit(cache=True, error_model="numpy", inline="always")  # inlined: vectorises in loops
def exp32(x):
    """exp(x) for float32 x <= 0 (NaN for NaN), no call: vectorisable. x > 0 gives 1 (a
    vectorised select computes both branches)."""
    low, zero = np.float32(-104.0), np.float32(0)  # exp(-104) < half the least float32
    t = x if x > low else low                      # NaN becomes -104 here, NaN again below
    t = t if t < zero else zero                    # x > 0 (the other branch of a select)
    n = np.floor(t * np.float32(1 / math.log(2)) + np.float32(0.5))   # round(t / ln 2)
    r = (t - n * np.float32(LN2_HI_32)) - n * np.float32(LN2_LO_32)   # |r| <= ln2 / 2
    p = TAYLOR_32[0]
    for coef in TAYLOR_32[1:]:
        p = p * r + coef                           # exp(r), Horner
    k = np.int32(n)                                # -150 .. 0
    tiny = k < -126                                # 2^k subnormal: 2^(k + 64) 2^-64
    e = p * with_bits(((k + 64 if tiny else k) + 127) << 23, x)      # 2^n exp(r)
    e = e * np.float32(2.0 ** -64) if tiny else e  # one rounding, even when subnormal
    return e if x == x else x


@njit(cache=True, error_model="numpy", inline="always")
def exp64(x):
    """exp(x) for float64 x <= 0 (NaN for NaN)."""
    low = -746.0                                   # exp(-746) < half the least float64
    t = x if x > low else low
    t = t if t < 0.0 else 0.0
    n = np.floor(t * (1 / math.log(2)) + 0.5)
    r = (t - n * LN2_HI_64) - n * LN2_LO_64
    p = TAYLOR_64[0]
    for coef in TAYLOR_64[1:]:
        p = p * r + coef
    k = np.int64(n)                                # -1075 .. 0
    tiny = k < -1022
    e = p * with_bits(((k + 128 if tiny else k) + 1023) << 52, x)
    e = e * 2.0 ** -128 if tiny else e
    return e if x == x else x


def phi(x):
    """elu(x) + 1 of one float, Eq. (7); compiled code gets ``_phi`` (float32 stays float32)."""
    return x + 1 if x > 0 else math.exp(x)


def dphi(x):
    """d phi / dx of one float: 1 for x > 0, else exp(x); compiled code gets ``_dphi``."""
    return 1.0 if x > 0 else math.exp(x)


@njit(cache=True, error_model="numpy", inline="always")
def libm_exp(x):
    """exp(x) by the C library, one call an element: the fallback without ``_internals``."""
    return math.exp(x)


def _typed(x):
    """(1 in x's type, the exp for x's type) for a Numba float type."""
    one = np.float32(1) if x == types.float32 else 1.0
    if not NATIVE:
        return one, libm_exp
    return one, (exp32 if x == types.float32 else exp64)


@overload(phi)
def _phi(x):
    if isinstance(x, types.Float):
        one, exp = _typed(x)
        return lambda x: x + one if x > 0 else exp(x)


@overload(dphi)
def _dphi(x):
    if isinstance(x, types.Float):
        one, exp = _typed(x)
        return lambda x: one if x > 0 else exp(x)


def dphi_from_phi(p):
    """d phi / dx from p = phi(x): min(1, p), bit for bit ``dphi(x)``. For x > 0, p = x + 1
    >= 1 and the slope is 1; for x <= 0, p = exp(x) <= 1 is the slope; a NaN x has a NaN p.
    The chunked and quadratic kernels' chain rules use it: their ``g *= 1 if x > 0 else p``
    compiled to a store only where x <= 0, vectorised as a masked store (slow with AVX2 on
    AMD's Zen CPUs: see ``flash_tiles``); ``np.minimum`` stores every element, and the loop
    reads one array fewer. Compiled code gets ``_dphi_from_phi``."""
    return np.minimum(1.0, p)


@overload(dphi_from_phi)
def _dphi_from_phi(p):
    if isinstance(p, types.Float):
        one = _typed(p)[0]
        return lambda p: np.minimum(one, p)


def features(x):
    """phi(x) elementwise: a new C-contiguous array shaped as x (any layout)."""
    out = np.empty(x.shape, dtype=x.dtype)
    phi_into(np.ascontiguousarray(x).reshape(-1), out.reshape(-1))
    return out


def vjp_(x, dfeatures):
    """dfeatures * d phi / dx elementwise, shaped as x: computed in place when dfeatures is
    C-contiguous (and returned), else in a C-contiguous copy."""
    grad = np.ascontiguousarray(dfeatures)
    _times_dphi_(np.ascontiguousarray(x).reshape(-1), grad.reshape(-1))
    return grad


# The loops take their arrays as arguments: with an array allocated in the same compiled
# function, LLVM did not vectorise them, and they ran several times slower.
@njit(cache=True, error_model="numpy")
def phi_into(x, out):
    """out[i] = phi(x[i]) over two 1-D arrays: the vectorised loop every kernel uses."""
    for i in range(x.size):
        out[i] = phi(x[i])


@njit(cache=True, error_model="numpy")
def _times_dphi_(x, dfeatures):
    """dfeatures[i] *= d phi / dx (x[i]) over two 1-D arrays."""
    for i in range(x.size):
        dfeatures[i] *= dphi(x[i])
