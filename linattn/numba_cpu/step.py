"""One step of the RNN, Eq. (16)-(20) of Katharopoulos et al. (2020), arXiv:2006.16236, as one
compiled call: feature map (elu+1, Eq. 7, when ``elu``), state update, readout and normaliser.
``step`` returns a new state (``linattn.linear_attention_step``); ``step_into`` updates the
state it is given in place (``linattn.Recurrence``), and ``step_into_compensated`` does so by
Kahan's compensated summation. Oracles: the functions of the same names in
``forms.recurrent``.

A generated token costs O(F M) per head whatever its position; at 8 heads and F = M = 64 the
kernel reads and writes the 128 KB state once, a few microseconds, so the loop is serial:
waking threads would cost more than the work. The arrays keep their leading axes across the
call (the kernel flattens them), since every reshape or wrapper in Python costs as much as a
tenth of the kernel, and each array argument of a compiled call costs a little too.
No fastmath: the compensated kernel relies on every addition being rounded in the order
written (fastmath would let LLVM simplify the compensation (t - s) - y to 0).
"""
import numpy as np
from numba import njit

from ..feature_maps import EluPlusOne
from ..forms.recurrent import State
from .elu import phi_into

FUSED_FEATURE_MAPS = (EluPlusOne,)  # applied by the kernel itself to raw q, k (elu=True)
SUPPORTS = frozenset()  # the step family has no options


def step(phi_q, phi_k, v, state, eps, elu=False):
    """Update the state with (phi_k, v), then read it out with phi_q.

    Parameters
    ----------
    phi_q, phi_k : ndarray, shape (..., F)
        Features, or the raw q_t and k_t when ``elu`` (elu+1 is applied here).
    v : ndarray, shape (..., M)
    state : State
        S (..., F, M) and z (..., F), in v's dtype.

    Returns
    -------
    out : ndarray, shape (..., M)
    state : State
        The new (S, z); the old one is not modified.

    Cost: O(F M) time per leading index: a copy of the state, then ``step_into``'s pass.
    """
    new = State(np.array(state.S, order="C"), np.array(state.z, order="C"))   # copies
    out = np.empty(v.shape, v.dtype)
    step_into(phi_q, phi_k, v, *new, out, v.dtype.type(eps), elu)
    return out, new


@njit(cache=True, error_model="numpy", inline="always")
def _rows(x, rows):
    """x (..., W) as (rows, W), C-contiguous: a view, or a copy of a strided array."""
    return np.ascontiguousarray(x).reshape(rows, x.shape[-1])


@njit(cache=True, error_model="numpy", inline="always")
def _as_rows(q, k, v, s, z, out):
    """The arrays with their leading axes flattened into R rows, counted through a non-empty
    width (F or M may be 0): q, k (R, F or D), v, out (R, M), s (R, F, M), z (R, F)."""
    f_width, m_width = s.shape[-2], s.shape[-1]
    rows = v.size // m_width if m_width else (z.size // f_width if f_width else 0)
    return (_rows(q, rows), _rows(k, rows), _rows(v, rows), s.reshape(rows, f_width, m_width),
            z.reshape(rows, f_width), out.reshape(rows, m_width))


@njit(cache=True, error_model="numpy", inline="always")
def _scratch(s):
    """Scratch rows in s's dtype: phi(q) and phi(k) (F,), the numerator phi(q)^T S (M,)."""
    f_width, m_width = s.shape[-2], s.shape[-1]
    return (np.empty(f_width, dtype=s.dtype), np.empty(f_width, dtype=s.dtype),
            np.empty(m_width, dtype=s.dtype))


@njit(cache=True, error_model="numpy", inline="always")
def _features(q_r, k_r, elu, phi_q, phi_k):
    """phi(q), phi(k) of one row into phi_q, phi_k: elu+1 (Eq. 7) or a copy of features."""
    if elu:
        phi_into(q_r, phi_q)
        phi_into(k_r, phi_k)
    else:
        phi_q[:], phi_k[:] = q_r, k_r


@njit(cache=True, error_model="numpy")
def step_into(q, k, v, s, z, out, eps, elu=False):
    """``step`` in place, for each leading index r: s += phi(k) v^T, z += phi(k)  Eq. (18)-(19)
    and out = phi(q)^T s / (phi(q)^T z + eps)                                    Eq. (20).

    Parameters
    ----------
    q, k : ndarray, shape (..., F)
        Features, or the raw q_t and k_t (..., D) when ``elu`` (elu+1 is applied here);
        any strides (a strided array is copied).
    v : ndarray, shape (..., M)
    s : ndarray, shape (..., F, M), C-contiguous, updated in place
    z : ndarray, shape (..., F), C-contiguous, updated in place
    out : ndarray, shape (..., M), C-contiguous, written
    eps : scalar of v's dtype (a Python float would make the float32 kernel compute the
        normaliser in float64)
    elu : bool

    A compiled function that ``linattn.Recurrence`` calls as it is: every Python wrapper
    would add to a step that costs a few microseconds. Writing into a separate s_new
    instead would read the same, but when s_new is s LLVM's overlap check sends the loop to
    its scalar version, several times slower. Cost: O(F M) time per leading index, one pass
    over S, no allocation beyond three rows of scratch.
    """
    q2, k2, v2, s3, z2, out2 = _as_rows(q, k, v, s, z, out)
    rows, f_width, m_width = s3.shape
    phi_q, phi_k, num = _scratch(s)
    for r in range(rows):
        _features(q2[r], k2[r], elu, phi_q, phi_k)
        v_r = v2[r]
        num[:] = 0
        for f in range(0, f_width - 1, 2):          # rows f and f + 1 of S together: num is
            s0, s1 = s3[r, f], s3[r, f + 1]         # loaded and stored once for both
            k0, k1, p0, p1 = phi_k[f], phi_k[f + 1], phi_q[f], phi_q[f + 1]
            for m in range(m_width):                # vectorised over m
                a0 = s0[m] + k0 * v_r[m]            # S_i = S_{i-1} + phi(k_i) v_i^T, row f
                a1 = s1[m] + k1 * v_r[m]            # ... and row f + 1
                s0[m], s1[m] = a0, a1
                num[m] = (num[m] + p0 * a0) + p1 * a1   # phi(q_i)^T S_i, in the order of f
        if f_width % 2:                             # the last row of an odd F
            f = f_width - 1
            s_row = s3[r, f]
            for m in range(m_width):
                s_fm = s_row[m] + phi_k[f] * v_r[m]
                s_row[m] = s_fm
                num[m] += phi_q[f] * s_fm
        den = eps
        for f in range(f_width):
            z2[r, f] += phi_k[f]                    # z_i = z_{i-1} + phi(k_i)
            den += phi_q[f] * z2[r, f]              # phi(q_i)^T z_i + eps
        for m in range(m_width):
            out2[r, m] = num[m] / den


@njit(cache=True, error_model="numpy")
def step_into_compensated(q, k, v, s, z, s_c, z_c, out, eps, elu=False):
    """``step_into`` with Kahan's compensation s_c, z_c (s's and z's shapes, C-contiguous,
    updated in place): each addition as ``forms.recurrent.kahan_add_``, in the same order,
    so that the state equals NumPy's bit for bit. The readout uses the sums s, z as they
    are. Cost: O(F M) time per leading index, one pass over S and S_c."""
    q2, k2, v2, s3, z2, out2 = _as_rows(q, k, v, s, z, out)
    rows, f_width, m_width = s3.shape
    c3, zc2 = s_c.reshape(s3.shape), z_c.reshape(z2.shape)     # the compensation, as s, z
    phi_q, phi_k, num = _scratch(s)
    for r in range(rows):
        _features(q2[r], k2[r], elu, phi_q, phi_k)
        v_r = v2[r]
        num[:] = 0
        den = eps
        for f in range(f_width):
            s_row, c_row = s3[r, f], c3[r, f]
            for m in range(m_width):
                y = phi_k[f] * v_r[m] - c_row[m]    # the term, less what was lost before
                t = s_row[m] + y                    # S_i = S_{i-1} + phi(k_i) v_i^T, rounded
                c_row[m] = (t - s_row[m]) - y       # what this rounding lost, negated
                s_row[m] = t
                num[m] += phi_q[f] * t              # phi(q_i)^T S_i
            y = phi_k[f] - zc2[r, f]
            t = z2[r, f] + y                        # z_i = z_{i-1} + phi(k_i), rounded
            zc2[r, f] = (t - z2[r, f]) - y
            z2[r, f] = t
            den += phi_q[f] * t                     # phi(q_i)^T z_i + eps
        for m in range(m_width):
            out2[r, m] = num[m] / den
