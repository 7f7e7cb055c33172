"""The delta rule's recurrent scan as compiled loops: ``method="recurrent"``,
``backend="numba"`` of ``linattn.delta_rule_attention`` (Schlag et al. 2021; Yang et al.
2024). Oracle: ``forms.delta``, whose functions these mirror name for name.

Per position, with unit features q, k (F), value v (M), strength beta and memory S (F, M):
u = v - S^T k, S += beta k u^T, out = S^T q; O(F M) per position, O(F M) memory per row.
The backward walks each segment of C positions back from its replayed states, as the NumPy
form does (``forms.delta.attend_backward``): memory O((N / C + C) F M) per row.
Serial loops over rows and positions: no fastmath, every sum in the order written.
"""
import math

import numpy as np
from numba import njit

from .._checks import rows
from ..forms.delta import default_segment

FUSED_FEATURE_MAPS = ()                     # features are computed before the kernel
SUPPORTS = frozenset({"initial_state", "return_state"})  # dispatch; always causal


@njit(cache=True)
def _advance(q, k, v, beta, S, out):
    """Positions 0..n-1 of one row: S (F, M) updated in place, out (n, M) written (skipped
    when out has no rows)."""
    f_width, m_width = S.shape
    u = np.empty(m_width, dtype=S.dtype)
    for t in range(k.shape[0]):
        for m in range(m_width):                       # u = v_t - S^T k_t
            acc = v[t, m]
            for f in range(f_width):
                acc -= S[f, m] * k[t, f]
            u[m] = acc
        for f in range(f_width):                       # S += beta_t k_t u^T
            w = beta[t] * k[t, f]
            for m in range(m_width):
                S[f, m] += w * u[m]
        if out.shape[0]:
            for m in range(m_width):                   # out_t = S^T q_t
                acc = 0.0
                for f in range(f_width):
                    acc += S[f, m] * q[t, f]
                out[t, m] = acc


@njit(cache=True)
def _scan(q, k, v, beta, S, out):
    """Every row r: ``_advance`` from S[r] (updated in place) over its N positions."""
    for r in range(q.shape[0]):
        _advance(q[r], k[r], v[r], beta[r], S[r], out[r])


@njit(cache=True)
def _scan_backward(dout, q, k, v, beta, S0, G, dq, dk, dv, dbeta, c):
    """Backward through time, every row r: G[r] (the adjoint, dL/dS_N on entry) ends as
    dL/dS_0; dq, dk, dv, dbeta written. Equations: ``forms.delta.attend_backward``."""
    n, f_width, m_width = q.shape[1], S0.shape[1], S0.shape[2]
    n_seg = (n + c - 1) // c
    none = np.empty((0, m_width), dtype=S0.dtype)
    u, du = np.empty(m_width, dtype=S0.dtype), np.empty(m_width, dtype=S0.dtype)
    gu = np.empty(f_width, dtype=S0.dtype)
    for r in range(q.shape[0]):
        stored = np.empty((n_seg, f_width, m_width), dtype=S0.dtype)
        S = S0[r].copy()
        for s in range(n_seg):                         # the memory entering each segment
            stored[s] = S
            a, b = s * c, min(s * c + c, n)
            _advance(q[r, a:b], k[r, a:b], v[r, a:b], beta[r, a:b], S, none)
        Gr = G[r]
        states = np.empty((c + 1, f_width, m_width), dtype=S0.dtype)
        for s in range(n_seg - 1, -1, -1):
            a, b = s * c, min(s * c + c, n)
            states[0] = stored[s]
            for i in range(a, b):                      # replay: states[i - a + 1] = S_i
                states[i - a + 1] = states[i - a]
                _advance(q[r, i:i + 1], k[r, i:i + 1], v[r, i:i + 1], beta[r, i:i + 1],
                         states[i - a + 1], none)
            for i in range(b - 1, a - 1, -1):
                prev, now = states[i - a], states[i - a + 1]
                for f in range(f_width):               # dq_i = S_i dout_i; G += q_i dout_i^T
                    acc = 0.0
                    for m in range(m_width):
                        acc += now[f, m] * dout[r, i, m]
                        Gr[f, m] += q[r, i, f] * dout[r, i, m]
                    dq[r, i, f] = acc
                for m in range(m_width):               # u_i = v_i - S_{i-1}^T k_i
                    acc = v[r, i, m]
                    for f in range(f_width):
                        acc -= prev[f, m] * k[r, i, f]
                    u[m] = acc
                db = 0.0
                for f in range(f_width):               # G u_i; dbeta_i = k_i^T G u_i
                    acc = 0.0
                    for m in range(m_width):
                        acc += Gr[f, m] * u[m]
                    gu[f] = acc
                    db += k[r, i, f] * acc
                dbeta[r, i] = db
                for m in range(m_width):               # du_i = beta_i G^T k_i = dv_i
                    acc = 0.0
                    for f in range(f_width):
                        acc += Gr[f, m] * k[r, i, f]
                    du[m] = beta[r, i] * acc
                    dv[r, i, m] = du[m]
                for f in range(f_width):               # dk_i = beta_i G u_i - S_{i-1} du_i
                    acc = beta[r, i] * gu[f]
                    for m in range(m_width):
                        acc -= prev[f, m] * du[m]
                        Gr[f, m] -= k[r, i, f] * du[m]  # G <- G - k_i du_i^T
                    dk[r, i, f] = acc


def _zero(q, v):
    return np.zeros((*v.shape[:-2], q.shape[-1], v.shape[-1]), dtype=v.dtype)


def attend(q, k, v, beta, *, chunk_size=None, initial_state=None, return_state=False):
    """As ``forms.delta.attend``: out (..., N, M), and S_N with ``return_state``."""
    S = np.array(_zero(q, v) if initial_state is None else initial_state, order="C")
    out = np.empty((*q.shape[:-1], v.shape[-1]), dtype=v.dtype)
    r = math.prod(q.shape[:-2])                          # rows: the leading axes flattened
    _scan(rows(q), rows(k), rows(v), rows(beta[..., None])[..., 0],
          S.reshape(r, *S.shape[-2:]), out.reshape(r, *out.shape[-2:]))  # views, written
    return (out, S) if return_state else out


def attend_backward(dout, q, k, v, beta, *, chunk_size=None, initial_state=None, dstate=None):
    """As ``forms.delta.attend_backward``: (dq, dk, dv, dbeta), and dS_0 when
    ``initial_state`` is given."""
    n = q.shape[-2]
    c = default_segment(n) if chunk_size is None else chunk_size
    S0 = _zero(q, v) if initial_state is None else initial_state
    G = np.array(np.zeros_like(S0) if dstate is None else dstate, dtype=v.dtype, order="C")
    dq, dk = np.empty(q.shape, v.dtype), np.empty(k.shape, v.dtype)
    dv, dbeta = np.empty(v.shape, v.dtype), np.empty(beta.shape, v.dtype)
    r = math.prod(q.shape[:-2])                          # rows: the leading axes flattened
    _scan_backward(rows(dout), rows(q), rows(k), rows(v), rows(beta[..., None])[..., 0],
                   rows(S0), G.reshape(r, *G.shape[-2:]), dq.reshape(r, *q.shape[-2:]),
                   dk.reshape(r, *k.shape[-2:]), dv.reshape(r, *v.shape[-2:]),
                   dbeta.reshape(r, n), c)
    grads = (dq, dk, dv, dbeta)
    return grads if initial_state is None else (*grads, G)


def step(q, k, v, beta, S):
    """As ``forms.delta.step``: (out (..., M), S_t (..., F, M)); S is not modified."""
    out, S = attend(q[..., None, :], k[..., None, :], v[..., None, :], beta[..., None],
                    initial_state=S, return_state=True)
    return out[..., 0, :], S
