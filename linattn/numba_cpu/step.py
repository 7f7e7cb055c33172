"""One step of the RNN, Eq. (16)-(20) of Katharopoulos et al. (2020), arXiv:2006.16236, as one
compiled call: feature map (elu+1, Eq. 7, when ``elu``), state update, readout and normaliser.
Same signature and result as ``forms.recurrent.step``, its oracle.

A generated token costs O(F M) per head whatever its position; at 8 heads and F = M = 64 the
kernel reads and writes the 128 KB state once (~3 us on the 2-core dev box, as long as a copy
of it), so the loop is serial: waking threads would cost more than the work. The arrays keep
their leading axes across the call (the kernel flattens them), since every reshape or
wrapper in Python costs as much as a tenth of the kernel.
"""
import numpy as np
from numba import njit

from ..forms.recurrent import State
from .elu import phi_into
from ..feature_maps import EluPlusOne

FUSED_FEATURE_MAPS = (EluPlusOne,)  # applied by the kernel itself to raw q, k (elu=True)


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

    Cost: O(F M) time per leading index, one pass over S.
    """
    c = np.ascontiguousarray      # Numba types a strided view slowly, ~8 us an array
    out, s_new, z_new = _step(c(phi_q), c(phi_k), c(v), c(state.S), c(state.z),
                              v.dtype.type(eps), elu)
    return out, State(s_new, z_new)


@njit(cache=True, error_model="numpy")
def _step(q, k, v, s, z, eps, elu):
    """For each leading index r: s_new = s + phi(k) v^T, z_new = z + phi(k)   Eq. (18)-(19)
    and out = phi(q)^T s_new / (phi(q)^T z_new + eps)                          Eq. (20).
    C-contiguous q, k (..., F), v (..., M), s (..., F, M), z (..., F); returns new arrays
    (out, s_new, z_new) of v's, s's and z's shapes; s and z are not changed."""
    f_width, m_width = k.shape[-1], v.shape[-1]
    # the leading axes flattened, counted through a non-empty width (D or M may be 0)
    rows = v.size // m_width if m_width else (k.size // f_width if f_width else 0)
    out, s_new, z_new = np.empty_like(v), np.empty_like(s), np.empty_like(z)
    q2, k2, v2, out2 = (q.reshape(rows, f_width), k.reshape(rows, f_width),
                        v.reshape(rows, m_width), out.reshape(rows, m_width))
    s3, new3 = s.reshape(rows, f_width, m_width), s_new.reshape(rows, f_width, m_width)
    z2, z_new2 = z.reshape(rows, f_width), z_new.reshape(rows, f_width)
    phi_q, phi_k = np.empty(f_width, dtype=q.dtype), np.empty(f_width, dtype=q.dtype)
    num = np.empty(m_width, dtype=v.dtype)
    for r in range(rows):
        if elu:                                     # Eq. (7), one vectorised pass each
            phi_into(q2[r], phi_q)
            phi_into(k2[r], phi_k)
        else:
            phi_q[:], phi_k[:] = q2[r], k2[r]
        v_r = v2[r]
        num[:] = 0
        den = eps
        for f in range(f_width):
            s_row, new_row = s3[r, f], new3[r, f]
            for m in range(m_width):                # vectorised over m
                s_fm = s_row[m] + phi_k[f] * v_r[m]   # S_i = S_{i-1} + phi(k_i) v_i^T
                new_row[m] = s_fm
                num[m] += phi_q[f] * s_fm           # phi(q_i)^T S_i
            z_new2[r, f] = z2[r, f] + phi_k[f]      # z_i = z_{i-1} + phi(k_i)
            den += phi_q[f] * z_new2[r, f]          # phi(q_i)^T z_i + eps
        for m in range(m_width):
            out2[r, m] = num[m] / den
    return out, s_new, z_new
