"""One RNN step of causal linear attention for many sequences at once on the GPU: Eq. (16)-(20)
of Katharopoulos et al. (2020), arXiv:2006.16236, as one kernel (rnn_step.cu) that streams the
state S through once. ``step`` (``linattn.linear_attention_step`` with ``backend="cupy"``)
writes a new state; ``step_into`` (``linattn.Recurrence``) updates the state in place (v1,
run in place) and ``step_into_compensated`` by Kahan's compensated summation (v2). Oracles:
the functions of the same names in ``linattn.forms.recurrent``.
"""
import math

from ..forms.recurrent import State
from . import launch

FUSED_FEATURE_MAPS = ()  # every feature map is applied before the kernel
SUPPORTS = frozenset()  # the step family has no options


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


def step_into(phi_q, phi_k, v, S, z, out, eps):
    """``step`` in place: S += phi_k v^T, z += phi_k, Eq. (18)-(19), and the readout,
    Eq. (20), written into ``out``: v1 run in place (s_new = s, z_new = z; see rnn_step.cu).

    Parameters
    ----------
    phi_q, phi_k, v
        As for ``step`` (any strides).
    S : cupy.ndarray, shape (..., F, M), C-contiguous, updated in place
    z : cupy.ndarray, shape (..., F), C-contiguous, updated in place
    out : cupy.ndarray, shape (..., M), C-contiguous, written
    eps : float

    Cost: as ``step``, no allocation but the copies of strided inputs.
    """
    b, f, m, q, k, vv = _flat(phi_q, phi_k, v)
    _require_c_order(S, z, out)
    launch.launch("rnn_step.cu", "rnn_step", (b,), (q, k, vv, S, z, S, z, out, f, m, float(eps)))


def step_into_compensated(phi_q, phi_k, v, S, z, S_c, z_c, out, eps):
    """``step_into`` by Kahan's compensated summation (v2, ``rnn_step_compensated``), S_c and
    z_c the compensation of S and z (their shapes, C-contiguous), all updated in place.
    Cost: as ``step`` with twice the memory traffic."""
    b, f, m, q, k, vv = _flat(phi_q, phi_k, v)
    _require_c_order(S, z, S_c, z_c, out)
    launch.launch("rnn_step.cu", "rnn_step_compensated", (b,),
                  (q, k, vv, S, z, S_c, z_c, out, f, m, float(eps)))


def _require_c_order(*arrays):
    """The kernels write these arrays in place through their flat C layout."""
    if not all(a.flags.c_contiguous for a in arrays):
        raise ValueError("step_into updates the state and out in place: they must be "
                         "C-contiguous")
