"""The element pieces of one block of ``chunked``'s sweeps (Katharopoulos et al. (2020),
arXiv:2006.16236, Eq. 7 and 9-15): a block's features loaded (elu+1 applied as they load),
a dot product, the masked products tril / triu(x y^T), a block's increment of a state, and
the elu chain rule. Plain compiled loops around BLAS (``blas.gemm``).
Oracle: ``forms.chunked``, through ``chunked``'s tests.
"""
import numpy as np
from numba import njit

from . import elu as elu_map
from .blas import gemm


@njit(cache=True, error_model="numpy")
def load(x, r, i0, i1, elu):
    """phi(x[r, i0:i1]) (C, W) if ``elu``, else those rows themselves."""
    rows = x[r, i0:i1]
    if not elu:
        return rows
    features = np.empty(rows.shape, dtype=rows.dtype)
    elu_map.phi_into(rows.reshape(rows.size), features.reshape(features.size))  # Eq. (7)
    return features


@njit(cache=True, error_model="numpy")
def dot(x, y):
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
def masked(x, y, reverse):
    """tril(x y^T), or triu(x y^T) if reverse: x_i . y_j for the pairs of the block that
    see each other, (C, C)."""
    c = x.shape[0]
    scores = np.empty((c, c), dtype=x.dtype)
    gemm(x, y.T, scores, 0)
    zero = x.dtype.type(0)
    for i in range(c):
        for j in range(i) if reverse else range(i + 1, c):
            scores[i, j] = zero                            # assigned: 0 * NaN would be NaN
    return scores


@njit(cache=True, error_model="numpy")
def accumulate(x, y, w, S, z):
    """S += x^T y (F, M) and z += x^T w (F,): a block's increment of a state, phi_k^T v and
    phi_k^T 1 (Eq. 10-11), or phi_q^T dnum and phi_q^T dden (DKV)."""
    gemm(x.T, y, S, 1)
    for i in range(x.shape[0]):
        for f in range(z.size):
            z[f] += x[i, f] * w[i]


@njit(cache=True, error_model="numpy")
def chain_elu(grad, phi_b, elu):
    """With ``elu``, grad *= d phi / dx in place: the block's gradient with respect to its
    features (phi_b, loaded by ``load``) becomes that with respect to the raw rows. See
    ``elu.dphi_from_phi``."""
    if not elu:
        return
    for i in range(grad.shape[0]):
        for f in range(grad.shape[1]):
            grad[i, f] *= elu_map.dphi_from_phi(phi_b[i, f])
