"""One BLAS matrix product that adds into its output, callable from compiled code:
``gemm(a, b, out, beta)`` sets out = a b + beta out.

Numba's ``np.dot(a, b, out)`` always overwrites ``out``; the blocked kernels (``chunked``)
mostly want to add a product to something they hold: the state, S += phi_k^T v (Eq. 10), or
a block's output, out = phi_q S, then out += tril(phi_q phi_k^T) v (Eq. 9). With a product
into a temporary and a separate add, each block reads and writes a (D, M) or (C, M) array
once more and allocates it, a visible share of the backward's time at the default sizes.
BLAS gemm computes alpha a b + beta c in one call, so ``gemm`` hands beta through, using
the same entry point as Numba's own ``np.dot`` (``numba_xxgemm``, SciPy's BLAS), reached
through ``_internals``. Where that private API is missing (``NATIVE`` is False), ``gemm`` is
plain compiled loops: the same results, several times slower.
Oracle: NumPy's a @ b + beta * out (``test_numba_cpu``).
"""
import numpy as np
from numba import njit

try:
    from ._internals import xxgemm     # Numba's private BLAS entry (see _internals)
except ImportError:
    xxgemm = None
NATIVE = xxgemm is not None


@njit(cache=True, error_model="numpy")
def gemm(a, b, out, beta):
    """out = a @ b + beta * out, in place, for 2-D float arrays: a (m, k) and b (k, n) C- or
    F-ordered (a transposed C array is F-ordered: no copy), out (m, n) C-ordered.
    beta = 0 ignores out's old values (NaN there included), as BLAS does; k = 0 gives
    beta * out, and an empty out is left alone (BLAS rejects zero leading dimensions)."""
    if a.shape[0] != out.shape[0] or b.shape[1] != out.shape[1] or a.shape[1] != b.shape[0]:
        raise ValueError("gemm: shapes do not match")
    if out.size == 0:
        return
    if a.shape[1] == 0:
        if beta == 0:
            out[:] = 0
        else:
            out *= beta
        return
    _product(a, b, out, beta)


@njit(cache=True, error_model="numpy")
def _blas(a, b, out, beta):
    xxgemm(a, b, out, beta)


@njit(cache=True, error_model="numpy")
def _loops(a, b, out, beta):
    """out = a b + beta out by loops, the fallback: row i of out gets a[i, l] b[l] for each l
    (vectorised along out's row)."""
    row = np.empty(out.shape[1], dtype=out.dtype)
    for i in range(out.shape[0]):
        row[:] = 0
        for l in range(a.shape[1]):  # noqa: E741 (l: the summed index of a b)
            a_il = a[i, l]
            for j in range(out.shape[1]):
                row[j] += a_il * b[l, j]
        for j in range(out.shape[1]):
            out[i, j] = row[j] if beta == 0 else row[j] + beta * out[i, j]


_product = _blas if NATIVE else _loops
