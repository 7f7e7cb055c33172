"""Rounding in the RNN state, measured: the helpers of notebook 09 (drift and compensated
sums) and notebook 11 (float16).

The RNN state of causal linear attention, Eq. (16)-(20) of Katharopoulos et al. (2020),
arXiv:2006.16236, is two running sums, S_i = S_{i-1} + phi(k_i) v_i^T and
z_i = z_{i-1} + phi(k_i). Here they are computed three ways, so a notebook can measure how
far float32 drifts from float64 over 10^6 positions:

- ``running_states``: the sums as the RNN adds them, one position after the other (np.cumsum
  adds sequentially, exactly the arithmetic of ``linattn.linear_attention_step``);
- ``chunked_states``: as the chunked form adds them, block sums K_c^T V_c, then a running
  sum over blocks;
- ``compensated_states``: Kahan's compensated summation, one position after the other
  (compiled, no fastmath: fastmath would let the compiler cancel the compensation).

``kahan_step`` is one compensated RNN step, written from scratch in the layout of the
library's Numba step (``linattn.numba_cpu.step``). The library's own option,
``compensated=True`` of ``linattn.Recurrence`` and ``linattn.linear_attention_step``, adds by
the same four operations; notebook 09 and tests/test_lab_rounding.py check that its state is
these helpers' bit for bit.
"""
import numpy as np
from numba import njit

from ..numba_cpu.elu import phi_into

FLOAT16_MAX = float(np.finfo(np.float16).max)          # 65504


class Identity:
    """A feature map that returns its input: give the library features computed beforehand,
    so that the library's step and these helpers add exactly the same numbers."""

    def forward(self, x):
        return x

    def vjp(self, x, dphi):
        return dphi


def checkpoints(n, count=25, multiple=64, start=128):
    """About ``count`` positions from ``start`` to ``n``, evenly spaced in log, each a
    multiple of ``multiple`` (a chunk boundary)."""
    points = np.geomspace(start, n, count) // multiple * multiple
    return np.unique(points.astype(np.int64))


def running_states(phi_k, v, at, dtype, block=2**14):
    """(S, z) after each position count in ``at``, summed one position at a time in ``dtype``.

    phi_k (N, F), v (N, M); returns S (len(at), F, M) and z (len(at), F). Blocks of
    ``block`` positions go through np.cumsum with the running state in front, so the result
    is exactly the sequential sum, in O(block F M) memory.
    """
    f, m = phi_k.shape[1], v.shape[1]
    s, z = np.zeros((f, m), dtype), np.zeros(f, dtype)
    out_s, out_z = np.empty((len(at), f, m), dtype), np.empty((len(at), f), dtype)
    for start in range(0, int(at[-1]), block):
        stop = min(start + block, int(at[-1]))
        terms = phi_k[start:stop, :, None].astype(dtype) * v[start:stop, None, :].astype(dtype)
        s_run = np.cumsum(np.concatenate([s[None], terms]), axis=0)        # S_start .. S_stop
        z_run = np.cumsum(np.concatenate([z[None], phi_k[start:stop].astype(dtype)]), axis=0)
        for r, p in enumerate(at):
            if start < p <= stop:
                out_s[r], out_z[r] = s_run[p - start], z_run[p - start]
        s, z = s_run[-1], z_run[-1]
    return out_s, out_z


def chunked_states(phi_k, v, at, dtype, chunk_size=64):
    """(S, z) at the chunk boundaries ``at`` (multiples of ``chunk_size``) as the chunked form
    adds them: each chunk's K_c^T V_c and sum of phi(k) (a matrix product), then a running
    sum over chunks."""
    n_chunks = int(at[-1]) // chunk_size
    pk = phi_k[:n_chunks * chunk_size].astype(dtype).reshape(n_chunks, chunk_size, -1)
    vc = v[:n_chunks * chunk_size].astype(dtype).reshape(n_chunks, chunk_size, -1)
    s = np.cumsum(pk.transpose(0, 2, 1) @ vc, axis=0)                   # (NC, F, M)
    z = np.cumsum(pk.sum(axis=1), axis=0)                               # (NC, F)
    rows = np.asarray(at) // chunk_size - 1
    return s[rows], z[rows]


@njit(cache=True)
def _compensated_scan(phi_k, v, at, s, z, cs, cz, out_s, out_z):
    """Kahan summation of S and z over positions, recording them after each count in ``at``."""
    r = 0
    for i in range(at[-1]):
        for f in range(phi_k.shape[1]):
            y = phi_k[i, f] - cz[f]             # the term, corrected by what was lost before
            t = z[f] + y                        # the new sum, rounded
            cz[f] = (t - z[f]) - y              # what the rounding lost (negated)
            z[f] = t
            for m in range(v.shape[1]):
                y = phi_k[i, f] * v[i, m] - cs[f, m]
                t = s[f, m] + y
                cs[f, m] = (t - s[f, m]) - y
                s[f, m] = t
        if i + 1 == at[r]:
            out_s[r], out_z[r] = s, z
            r += 1


def compensated_states(phi_k, v, at, dtype):
    """(S, z) after each count in ``at``, summed one position at a time in ``dtype`` with
    Kahan's compensation: an error of a few units in the last place, whatever N."""
    phi_k, v = np.ascontiguousarray(phi_k, dtype), np.ascontiguousarray(v, dtype)
    at = np.asarray(at, np.int64)
    if not (len(phi_k) == len(v) >= at[-1] and np.all(np.diff(at) > 0) and at[0] > 0):
        raise ValueError(f"need phi_k (N, F), v (N, M) and increasing counts 1..N in at, got "
                         f"{phi_k.shape}, {v.shape}, at from {at[0]} to {at[-1]}")
    f, m = phi_k.shape[1], v.shape[1]
    out_s, out_z = np.empty((len(at), f, m), dtype), np.empty((len(at), f), dtype)
    _compensated_scan(phi_k, v, at, np.zeros((f, m), dtype),
                      np.zeros(f, dtype), np.zeros((f, m), dtype), np.zeros(f, dtype),
                      out_s, out_z)
    return out_s, out_z


def relative_error(got, want):
    """||got - want|| / ||want|| for each leading index (Frobenius over the rest)."""
    axes = tuple(range(1, want.ndim))
    diff = np.sqrt(np.sum((got.astype(np.float64) - want) ** 2, axis=axes))
    return diff / np.sqrt(np.sum(want ** 2, axis=axes))


@njit(cache=True, error_model="numpy")
def _kahan_step(q, k, v, s, z, cs, cz, eps):
    """One compensated RNN step, laid out as the library's ``numba_cpu.step.step_into`` (elu+1,
    Eq. 7, on raw q, k (R, F); v (R, M); s, cs (R, F, M); z, cz (R, F)): Eq. (18)-(19)
    with Kahan's compensation cs, cz, then Eq. (20). Returns new arrays
    (out, s, z, cs, cz); the inputs are not changed."""
    rows, f_width, m_width = v.shape[0], k.shape[1], v.shape[1]
    out, s_new, z_new = np.empty_like(v), np.empty_like(s), np.empty_like(z)
    cs_new, cz_new = np.empty_like(cs), np.empty_like(cz)
    phi_q, phi_k = np.empty(f_width, dtype=q.dtype), np.empty(f_width, dtype=q.dtype)
    num = np.empty(m_width, dtype=v.dtype)
    for r in range(rows):
        phi_into(q[r], phi_q)                          # elu + 1, Eq. (7)
        phi_into(k[r], phi_k)
        num[:] = 0
        den = eps
        for f in range(f_width):
            for m in range(m_width):
                y = phi_k[f] * v[r, m] - cs[r, f, m]    # the term, less what was lost before
                t = s[r, f, m] + y                      # S_i = S_{i-1} + phi(k_i) v_i^T
                cs_new[r, f, m] = (t - s[r, f, m]) - y  # what rounding lost, negated
                s_new[r, f, m] = t
                num[m] += phi_q[f] * t                  # phi(q_i)^T S_i
            y = phi_k[f] - cz[r, f]
            t = z[r, f] + y                             # z_i = z_{i-1} + phi(k_i)
            cz_new[r, f] = (t - z[r, f]) - y
            z_new[r, f] = t
            den += phi_q[f] * t                         # phi(q_i)^T z_i + eps
        for m in range(m_width):
            out[r, m] = num[m] / den
    return out, s_new, z_new, cs_new, cz_new


def kahan_step(q_t, k_t, v_t, state):
    """One compensated step for q_t, k_t (R, D), v_t (R, M) and ``state`` = (S, z, cS, cz);
    returns (out_t, new state). float32 or float64, C-contiguous; eps = 1e-6."""
    out, *state = _kahan_step(q_t, k_t, v_t, *state, v_t.dtype.type(1e-6))
    return out, tuple(state)
