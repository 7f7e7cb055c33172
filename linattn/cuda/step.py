"""One RNN step of causal linear attention for many sequences at once on the GPU: Eq. (16)-(20)
of Katharopoulos et al. (2020), arXiv:2006.16236, as one kernel (``rnn_step`` in rnn_step.cu)
that streams the state S through once. This is ``linattn.linear_attention_step`` with
``backend="cupy"``. Oracle: ``linattn.forms.recurrent.step``.
"""
import math

from ..forms.recurrent import State
from . import launch

FUSED_FEATURE_MAPS = ()  # every feature map is applied before the kernel


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
    lead, f, m = v.shape[:-1], phi_q.shape[-1], v.shape[-1]
    b = math.prod(lead)
    shapes = ((b, f), (b, f), (b, m), (b, f, m), (b, f))
    q, k, vv, s, z = (xp.ascontiguousarray(x.reshape(shape)) for x, shape in
                      zip((phi_q, phi_k, v, state.S, state.z), shapes))
    s_new, z_new, out = xp.empty_like(s), xp.empty_like(z), xp.empty_like(vv)
    launch.launch("rnn_step.cu", "rnn_step", (b,),
                  (q, k, vv, s, z, s_new, z_new, out, f, m, float(eps)))
    return out.reshape(v.shape), State(s_new.reshape(state.S.shape), z_new.reshape(state.z.shape))
