"""v2 of the CUDA causal product: a chunked scan with the normaliser fused, for causal linear
attention, Eq. (9)-(12) forward and Eq. (13)-(15) backward of Katharopoulos et al. (2020),
arXiv:2006.16236. This is ``method="chunked"`` (and ``"auto"``) with ``backend="cupy"``.

The sequence is cut into chunks of TILE = 64 positions; the kernels of causal_product.cu run in
three steps, each parallel over chunks, heads and 64-wide tiles of F or M:

1. ``chunk_states``: each chunk's K_c^T V_c (F, M) and sum of k (F), Eq. (10)-(11) over a chunk;
2. ``chunk_scan``: their exclusive prefix over chunks, S_c and z_c, the state entering chunk c;
3. ``chunk_forward``: out_c = (Q_c S_c + tril(Q_c K_c^T) V_c) / den_c with
   den_c = Q_c z_c + rowsum(tril(Q_c K_c^T)) + eps.

The backward recomputes the states (section 3.3.1), runs the same two steps backwards in time
for G_c = sum over later chunks of Q^T dnum, and then ``chunk_backward_qk`` and
``chunk_backward_v``. Memory: O(N F M / 64) for the chunk states, never a state per position.
Causal only: the dispatch table sends non-causal calls to NumPy's forms on CuPy arrays.

Key padding and states need no kernel of their own: a padded key's features and value are set
to 0 before the kernels (``forms.padding``), and a state (S0, z0) handed over is added to every
chunk's entering state S_c, z_c after the scan, which is where Eq. (20)'s S0 + S_i enters
(the backward adds the final state's gradient to every G_c the same way).
Oracle: the NumPy backend (``linattn.forms.chunked`` computes the same blocks).
"""
import math

import numpy as np

from .._checks import rows
from ..forms.padding import drop_padded, zero_padded
from ..forms.recurrent import State
from . import launch

FUSED_FEATURE_MAPS = ()  # every feature map is applied before the kernel
# causal only: dispatch sends non-causal calls to NumPy's forms
SUPPORTS = frozenset({"key_mask", "initial_state", "return_state"})


def _states(x, y, w, reverse):
    """Chunk states: s_c = sum_{c' < c} X_c'^T Y_c' (c' > c if ``reverse``) and z_c, the same
    with Y = w (ones if None).

    Shapes: x (H, N, P), y (H, N, R), w (H, N) or None -> s (H, NC, P, R), z (H, NC, P),
    NC = ceil(N / TILE).
    """
    xp = launch.array_module(x)
    h, n, p = x.shape
    r = y.shape[-1]
    nc = math.ceil(n / launch.TILE)
    s = xp.empty((h, nc, p, r), dtype=x.dtype)
    z = xp.empty((h, nc, p), dtype=x.dtype)
    grid = (h * nc, math.ceil(p / launch.TILE), math.ceil(r / launch.TILE))
    launch.launch("causal_product.cu", "chunk_states", grid, (x, y, w, s, z, n, p, r))
    for a in (s, z):                                        # prefix over chunks, in place
        e = a[0, 0].size
        launch.launch("causal_product.cu", "chunk_scan", (launch.blocks(h * e),),
                      (a, h, nc, np.int64(e), int(reverse)))
    return s, z


def _flat(state, h):
    """State (S (..., F, M), z (..., F)) -> (S (H, 1, F, M), z (H, 1, F)), to add to every
    chunk's state; None stays None."""
    if state is None:
        return None
    s, z = state
    return State(s.reshape(h, 1, *s.shape[-2:]), z.reshape(h, 1, z.shape[-1]))


def _forward(q, k, v, eps, initial=None):
    """out (H, N, M), den (H, N) and the forward states S_c, z_c, from (H, N, .) arrays;
    ``initial`` (S0 (H, 1, F, M), z0 (H, 1, F)) is added to every chunk's state."""
    xp = launch.array_module(v)
    h, n, f = q.shape
    m = v.shape[-1]
    s, z = _states(k, v, None, reverse=False)
    if initial is not None:
        s += initial.S
        z += initial.z
    out = xp.empty_like(v)
    den = xp.empty((h, n), dtype=v.dtype)
    grid = (h * math.ceil(n / launch.TILE), math.ceil(m / launch.TILE))
    launch.launch("causal_product.cu", "chunk_forward", grid,
                  (q, k, v, s, z, out, den, n, f, m, float(eps)))
    return out, den, s, z


def attend(phi_q, phi_k, v, *, causal, eps, chunk_size=None, key_mask=None,
           initial_state=None, return_state=False):
    """Normalised linear attention, Eq. (5) / (9), on CuPy arrays.

    Parameters
    ----------
    phi_q, phi_k : cupy.ndarray, shape (..., N, F), positive features
    v : cupy.ndarray, shape (..., N, M)
    key_mask : cupy.ndarray of bool, shape (..., N), optional
        False for a padded key: its features and value are taken as 0.
    initial_state : State, optional
        (S0 (..., F, M), z0 (..., F)), added to the state every position reads (Eq. 20).
    return_state : bool
        Also return the final state (S0 + S_N, z0 + z_N).

    Returns
    -------
    out : cupy.ndarray, shape (..., N, M); with ``return_state``, ``(out, State)``.

    Cost: O(N (64 (F + M) + F M)) time, O(N (F + M) + N F M / 64) memory. ``chunk_size`` is
    ignored: the chunk is the kernels' tile, 64 positions.
    """
    launch.require_causal(causal)
    phi_k, v = drop_padded(phi_k, v, key_mask)
    if v.size == 0:                                          # N = 0, M = 0 or no heads
        out = v.copy()
    else:
        h = math.prod(v.shape[:-2])
        out, _, _, _ = _forward(*(rows(x) for x in (phi_q, phi_k, v)), eps,
                                _flat(initial_state, h))
        out = out.reshape(v.shape)
    if not return_state:
        return out
    return out, _final_state(phi_k, v, initial_state)


def _final_state(phi_k, v, initial_state):
    """(S0 + sum_j phi_k_j v_j^T, z0 + sum_j phi_k_j), shapes (..., F, M) and (..., F)."""
    s, z = phi_k.swapaxes(-1, -2) @ v, phi_k.sum(axis=-2)
    if initial_state is not None:
        s, z = s + initial_state.S, z + initial_state.z
    return State(s, z)


def attend_backward(dout, phi_q, phi_k, v, *, causal, eps, chunk_size=None, key_mask=None,
                    initial_state=None, dstate=None):
    """Backward of ``attend``: (dphi_q, dphi_k, dv), Eq. (13)-(15) with the normaliser, and
    State(dS0, dz0) after them when ``initial_state`` is given.

    With out = num / den: dnum = dout / den and dden = -dout . out / den, the gradients of the
    numerator and the normaliser; the kernels carry both back through the chunked scan.
    ``dstate`` (dS (..., F, M), dz (..., F)), the final state's gradient, reaches every key as
    dS v_j + dz and every value as dS^T phi_k_j: it is added to every chunk's G_c, g_c.
    dS0 = sum_i phi_q_i dnum_i^T + dS, dz0 = sum_i phi_q_i dden_i + dz. Padded keys get
    gradients of exactly 0. Cost: about three times ``attend``.
    """
    launch.require_causal(causal)
    xp = launch.array_module(v)
    phi_k, v = drop_padded(phi_k, v, key_mask)
    if v.size == 0:
        dq, dk, dv = xp.zeros_like(phi_q), xp.zeros_like(phi_k), v.copy()
        dinitial = None if initial_state is None else _initial_gradient(
            xp.zeros_like(v), xp.zeros(v.shape[:-1], v.dtype), phi_q, initial_state, dstate)
        return (dq, dk, dv) if dinitial is None else (dq, dk, dv, dinitial)
    q, k, v3, do = (rows(x) for x in (phi_q, phi_k, v, dout))
    h, n, f = q.shape
    m = v3.shape[-1]
    out, den, s, z = _forward(q, k, v3, eps, _flat(initial_state, h))  # recomputed
    dnum = do / den[..., None]                                # (H, N, M)
    dden = -(do * out).sum(axis=-1) / den                     # (H, N)
    g, gz = _states(q, dnum, dden, reverse=True)              # G_c, g_c
    if dstate is not None:
        final = _flat(dstate, h)
        g += final.S
        gz += final.z
    dq, dk, dv = xp.empty_like(q), xp.empty_like(k), xp.empty_like(v3)
    nc = math.ceil(n / launch.TILE)
    launch.launch("causal_product.cu", "chunk_backward_qk", (h * nc, math.ceil(f / launch.TILE)),
                  (q, k, v3, dnum, dden, s, z, g, gz, dq, dk, n, f, m))
    launch.launch("causal_product.cu", "chunk_backward_v", (h * nc, math.ceil(m / launch.TILE)),
                  (q, k, dnum, g, dv, n, f, m))
    dk, dv = zero_padded(key_mask, dk.reshape(phi_k.shape), dv.reshape(v.shape))
    grads = (dq.reshape(phi_q.shape), dk, dv)
    if initial_state is None:
        return grads
    lead = v.shape[:-2]
    return (*grads, _initial_gradient(dnum.reshape(*lead, n, m), dden.reshape(*lead, n),
                                      phi_q, initial_state, dstate))


def _initial_gradient(dnum, dden, phi_q, initial_state, dstate):
    """State(dS0, dz0) = (sum_i phi_q_i dnum_i^T + dS, sum_i phi_q_i dden_i + dz)."""
    ds0 = phi_q.swapaxes(-1, -2) @ dnum
    dz0 = (phi_q * dden[..., None]).sum(axis=-2)
    if dstate is not None:
        ds0, dz0 = ds0 + dstate.S, dz0 + dstate.z
    return State(ds0.astype(initial_state.S.dtype, copy=False),
                 dz0.astype(initial_state.z.dtype, copy=False))
