"""One RNN step of causal linear attention for many sequences at once on the GPU: Eq. (16)-(20)
of Katharopoulos et al. (2020), arXiv:2006.16236, as one kernel (rnn_step.cu) that streams the
state S through once. ``step`` (``linattn.linear_attention_step`` with ``backend="cupy"``)
writes a new state; ``step_into`` (``linattn.Recurrence``) updates the state in place, plainly
(v1, run in place) or by Kahan's compensated summation (v2). Oracles:
``linattn.forms.recurrent.step`` and ``step_into``.
"""
import math

from ..forms.recurrent import State
from . import launch

FUSED_FEATURE_MAPS = ()  # every feature map is applied before the kernel


def _flat(phi_q, phi_k, v):
    """(B, F, M and the inputs as C-contiguous (B, F), (B, F), (B, M)) for leading axes B."""
    xp = launch.array_module(v)
    b, f, m = math.prod(v.shape[:-1]), phi_q.shape[-1], v.shape[-1]
    q, k, vv = (xp.ascontiguousarray(x.reshape(b, x.shape[-1])) for x in (phi_q, phi_k, v))
    return b, f, m, q, k, vv


def step(phi_q, phi_k, v, state, eps):
    """s_t = s_{t-1} + phi_k v^T, z_t = z_{t-1} + phi_k, out = phi_q^T s_t / (phi_q . z_t + eps).

    Parameters
    ----------
    phi_q, phi_k : cupy.ndarray, shape (..., F), positive features
    v : cupy.ndarray, shape (..., M)
    state : State of cupy.ndarray, S (..., F, M) and z (..., F)

    Returns
    -------
    out : cupy.ndarray, shape (..., M)
    state : State, the new (S, z); the old one is left untouched.

    Cost: O(F M) per sequence, one read and one write of S: memory-bandwidth bound.
    """
    xp = launch.array_module(v)
    b, f, m, q, k, vv = _flat(phi_q, phi_k, v)
    s, z = (xp.ascontiguousarray(x.reshape(shape)) for x, shape in
            ((state.S, (b, f, m)), (state.z, (b, f))))
    s_new, z_new, out = xp.empty_like(s), xp.empty_like(z), xp.empty_like(vv)
    launch.launch("rnn_step.cu", "rnn_step", (b,),
                  (q, k, vv, s, z, s_new, z_new, out, f, m, float(eps)))
    return out.reshape(v.shape), State(s_new.reshape(state.S.shape), z_new.reshape(state.z.shape))


def step_into(phi_q, phi_k, v, state, out, eps):
    """``step`` in place: update ``state``'s arrays, Eq. (18)-(19), and write the readout,
    Eq. (20), into ``out``.

    Parameters
    ----------
    phi_q, phi_k, v
        As for ``step`` (any strides).
    state : State or CompensatedState of C-contiguous cupy.ndarray, updated in place; a
        CompensatedState (S, z, S_c, z_c) is updated by Kahan's compensated summation (v2).
    out : cupy.ndarray, shape (..., M), C-contiguous
    eps : float

    Cost: as ``step`` (twice the memory traffic when compensated), no allocation but the
    copies of strided inputs.
    """
    b, f, m, q, k, vv = _flat(phi_q, phi_k, v)
    if not all(a.flags.c_contiguous for a in (*state, out)):
        raise ValueError("step_into updates the state and out in place: they must be "
                         "C-contiguous")
    if len(state) == 2:               # v1 in place: s_new = s and z_new = z (see rnn_step.cu)
        s, z = state
        launch.launch("rnn_step.cu", "rnn_step", (b,), (q, k, vv, s, z, s, z, out, f, m,
                                                         float(eps)))
    else:
        launch.launch("rnn_step.cu", "rnn_step_compensated", (b,),
                      (q, k, vv, *state, out, f, m, float(eps)))
