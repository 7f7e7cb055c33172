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
    s_new = np.empty(state.S.shape, dtype=v.dtype)
    z_new = np.empty(state.z.shape, dtype=v.dtype)
    out = np.empty(v.shape, dtype=v.dtype)
    _step(phi_q.reshape(rows, f), phi_k.reshape(rows, f), v.reshape(rows, m),
          state.S.reshape(rows, f, m), state.z.reshape(rows, f), v.dtype.type(eps), elu,
          out.reshape(rows, m), s_new.reshape(rows, f, m), z_new.reshape(rows, f))
    return out, State(s_new, z_new)


@njit(cache=True, error_model="numpy")
def _phi(x, elu):
    """elu(x) + 1 (Eq. 7) if ``elu``, else x unchanged."""
    if not elu:
        return x
    return x + type(x)(1) if x > 0 else np.exp(x)  # type(x): float32 stays float32


@njit(cache=True, error_model="numpy")
def _step(q, k, v, s, z, eps, elu, out, s_new, z_new):
    """Rows r of: s_new = s + phi(k) v^T, z_new = z + phi(k)   Eq. (17)-(18)
    and out = phi(q)^T s_new / (phi(q)^T z_new + eps)           Eq. (19)."""
    rows, f_width = k.shape
    acc = np.empty((2, v.shape[1]), dtype=out.dtype)           # two partial sums
    for r in range(rows):
        q_r, k_r, v_r = q[r], k[r], v[r]
        acc[:] = 0
        den = eps
        for f in range(f_width):
            phi_k, phi_q = _phi(k_r[f], elu), _phi(q_r[f], elu)
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
