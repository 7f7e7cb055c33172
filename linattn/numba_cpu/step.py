"""One step of the RNN, Eq. (16)-(19) of Katharopoulos et al. (2020), arXiv:2006.16236, as one
compiled call: feature map (elu+1, Eq. 7, when ``elu``), state update, readout and normaliser.
Same signature and result as ``forms.recurrent.step``, its oracle.

A generated token costs O(F M) per head whatever its position; at F = M = 64 that is a few
microseconds, so the loop is serial: waking threads would cost more than the work.
"""
import math

import numpy as np
from numba import njit

from ..forms.recurrent import State
from .elu import phi


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
    rows = math.prod(v.shape[:-1])
    f, m = phi_k.shape[-1], v.shape[-1]
    c = np.ascontiguousarray      # Numba types a strided view slowly, ~8 us an array
    out, s_new, z_new = _step(c(phi_q.reshape(rows, f)), c(phi_k.reshape(rows, f)),
                              c(v.reshape(rows, m)), c(state.S.reshape(rows, f, m)),
                              c(state.z.reshape(rows, f)), v.dtype.type(eps), elu)
    return out.reshape(v.shape), State(s_new.reshape(state.S.shape),
                                       z_new.reshape(state.z.shape))


@njit(cache=True, error_model="numpy")
def _step(q, k, v, s, z, eps, elu):
    """Rows r of: s_new = s + phi(k) v^T, z_new = z + phi(k)   Eq. (17)-(18)
    and out = phi(q)^T s_new / (phi(q)^T z_new + eps)           Eq. (19).
    Returns new arrays (out (R, M), s_new (R, F, M), z_new (R, F)); s and z are not changed."""
    rows, f_width = k.shape
    out = np.empty(v.shape, dtype=v.dtype)
    s_new, z_new = np.empty(s.shape, dtype=s.dtype), np.empty(z.shape, dtype=z.dtype)
    acc = np.empty((2, v.shape[1]), dtype=out.dtype)           # two partial sums
    for r in range(rows):
        q_r, k_r, v_r = q[r], k[r], v[r]
        acc[:] = 0
        den = eps
        for f in range(f_width):
            phi_k, phi_q = (phi(k_r[f]), phi(q_r[f])) if elu else (k_r[f], q_r[f])
            s_row, new_row, part = s[r, f], s_new[r, f], acc[f % 2]
            for m in range(v_r.size):
                s_m = s_row[m] + phi_k * v_r[m]     # S_i = S_{i-1} + phi(k_i) v_i^T
                new_row[m] = s_m
                part[m] += phi_q * s_m              # phi(q_i)^T S_i
            z_new[r, f] = z[r, f] + phi_k           # z_i = z_{i-1} + phi(k_i)
            den += phi_q * z_new[r, f]              # phi(q_i)^T z_i + eps
        out_r = out[r]
        for m in range(v_r.size):
            out_r[m] = (acc[0, m] + acc[1, m]) / den
    return out, s_new, z_new
