"""Decayed and gated causal linear attention by running sums: the RNN of Katharopoulos et al.
(2020), arXiv:2006.16236, Eq. (18)-(20), with the gate of ``decay`` (RetNet's scalar decay,
GLA's per-feature gate) applied to the state before each update:

    S_i = diag(alpha_i) S_{i-1} + phi(k_i) v_i^T,   z_i = alpha_i * z_{i-1} + phi(k_i).

This is ``method="linear"`` and ``method="recurrent"`` with a decay, a log gate or without
the normaliser, and the gated step (``step``, ``step_into``) of ``linear_attention_step``
and ``Recurrence``. Only alpha_i = exp(g_i) <= 1 is ever formed. Oracle: ``decay.product``.
"""
from .._checks import array_module
from .decay import gated, gated_backward
from .recurrent import State

FUSED_FEATURE_MAPS = ()  # every feature map is applied before the kernel
SUPPORTS = frozenset({"non_causal", "key_mask", "initial_state", "return_state", "decay",
                      "log_gate", "unnormalized"})  # dispatch; gates causal only


def product(phi_q, phi_k, v, g, s0=None, chunk_size=None):
    """num_i = phi_q_i^T S_i with S_i = diag(exp(g_i)) S_{i-1} + phi_k_i v_i^T from S0 (0 when
    None), and the final state S_N.

    Shapes: phi_q, phi_k, g (..., N, F); v (..., N, W); s0 (..., F, W) ->
    (num (..., N, W), S_N (..., F, W)). Cost: O(N F W) time, O(F W) memory beyond the output;
    a Python loop over positions, vectorised over the leading axes.
    """
    xp = array_module(v)
    s = (xp.zeros((*v.shape[:-2], phi_k.shape[-1], v.shape[-1]), dtype=v.dtype)
         if s0 is None else s0.copy())
    alpha = xp.exp(g)                                               # (..., N, F), <= 1
    num = xp.empty(v.shape, dtype=v.dtype)
    for i in range(v.shape[-2]):
        s = alpha[..., i, :, None] * s + phi_k[..., i, :, None] * v[..., i, None, :]
        num[..., i, :] = (phi_q[..., i, None, :] @ s)[..., 0, :]     # phi_q_i^T S_i
    return num, s


def product_backward(dnum, phi_q, phi_k, v, g, s0=None, dfinal=None, chunk_size=None):
    """Backward of ``product``: (dphi_q, dphi_k, dv, dS0 or None).

    Forward in time, dphi_q_i = S_i dnum_i. Backward in time, the adjoint
    G_i = dL/dS_i = phi_q_i dnum_i^T + diag(alpha_{i+1}) G_{i+1}, from G_{N+1} = dS_N
    (``dfinal``, 0 when None) with alpha_{N+1} = 1, gives dphi_k_i = G_i v_i and
    dv_i = G_i^T phi_k_i; dS0 = diag(alpha_1) G_1. O(F W) memory beyond the gradients.
    """
    xp = array_module(v)
    n = v.shape[-2]
    shape = (*v.shape[:-2], phi_k.shape[-1], v.shape[-1])
    alpha = xp.exp(g)
    dphi_q, dphi_k, dv = xp.empty_like(phi_q), xp.empty_like(phi_k), xp.empty_like(v)
    s = xp.zeros(shape, dtype=v.dtype) if s0 is None else s0.copy()
    for i in range(n):                                              # forward in time
        s = alpha[..., i, :, None] * s + phi_k[..., i, :, None] * v[..., i, None, :]
        dphi_q[..., i, :] = (s @ dnum[..., i, :, None])[..., 0]
    adj = xp.zeros(shape, dtype=v.dtype) if dfinal is None else dfinal.copy()
    for i in reversed(range(n)):                                    # backward in time
        adj = adj + phi_q[..., i, :, None] * dnum[..., i, None, :]  # G_i
        dphi_k[..., i, :] = (adj @ v[..., i, :, None])[..., 0]
        dv[..., i, :] = (phi_k[..., i, None, :] @ adj)[..., 0, :]
        adj = alpha[..., i, :, None] * adj                          # dL/dS_{i-1}
    return dphi_q, dphi_k, dv, (None if s0 is None else adj)


def attend(phi_q, phi_k, v, *, causal, eps, chunk_size=None, log_gate=None, normalize=True,
           key_mask=None, initial_state=None, return_state=False):
    """Gated causal linear attention by running sums; arguments and result as
    ``decay.attend``. Cost: O(N F M) time, O(F M) memory beyond the output."""
    return gated(product, phi_q, phi_k, v, eps=eps, log_gate=log_gate, normalize=normalize,
                 key_mask=key_mask, initial_state=initial_state, return_state=return_state,
                 causal=causal)


def attend_backward(dout, phi_q, phi_k, v, *, causal, eps, chunk_size=None, log_gate=None,
                    normalize=True, key_mask=None, initial_state=None, dstate=None):
    """Backward of ``attend``: (dphi_q, dphi_k, dv, dlog_gate), and State(dS0, dz0) when
    ``initial_state`` is given. O(F M) memory beyond the gradients."""
    return gated_backward(product, product_backward, dout, phi_q, phi_k, v, eps=eps,
                          log_gate=log_gate, normalize=normalize, key_mask=key_mask,
                          initial_state=initial_state, dstate=dstate, causal=causal)


def step(phi_q, phi_k, v, state, eps, log_gate=None, normalize=True):
    """One gated position: S = diag(alpha) S + phi_k v^T, z = alpha * z + phi_k, then
    phi_q^T S / (phi_q^T z + eps) (or phi_q^T S when not ``normalize``).

    phi_q, phi_k, log_gate (..., F) with alpha = exp(log_gate) (1 when None); v (..., M);
    state (S (..., F, M), z (..., F)). Returns (out (..., M), new state). Cost O(F M).
    """
    xp = array_module(v)
    S, z = state
    if log_gate is not None:
        alpha = xp.exp(log_gate)                                    # (..., F), <= 1
        S, z = alpha[..., :, None] * S, alpha * z
    S = S + phi_k[..., :, None] * v[..., None, :]
    z = z + phi_k
    num = (phi_q[..., None, :] @ S)[..., 0, :]                      # phi_q^T S, (..., M)
    if normalize:
        num = num / ((phi_q * z).sum(axis=-1, keepdims=True) + eps)
    return num, State(S, z)


def step_into(phi_q, phi_k, v, S, z, out, eps, log_gate=None, normalize=True):
    """``step`` in place: S and z (C-contiguous) updated, ``out`` (..., M) written."""
    got, new = step(phi_q, phi_k, v, State(S, z), eps, log_gate, normalize)
    S[...], z[...], out[...] = new.S, new.z, got


def step_into_compensated(phi_q, phi_k, v, S, z, S_c, z_c, out, eps, log_gate=None,
                          normalize=True):
    """Not offered: Kahan's compensation corrects additions, and a gated step also
    multiplies the state; the public step refuses the combination before it gets here."""
    raise ValueError("compensated=True does not take a decay, a log gate or "
                     "normalize=False")
