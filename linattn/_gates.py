"""Decay and gates of causal linear attention, checked and folded into one log gate: the
glue between the public functions (``linear``) and the gated forms (``forms.decay``).

A decay gamma (RetNet, Sun et al. 2023; Mamba-2's scalar transition, Dao and Gu 2024) and a
log gate g (GLA, Yang et al. 2023) both multiply the state before an update; the forms take
one log gate per position and feature, log gamma + g, and return its gradient, which
``reduce_to`` brings back to the shapes the caller gave.
"""
from . import _checks


def sequence_gate(decay, log_gate, normalize, x_q):
    """(keywords, decay, log_gate): the kernel's ``log_gate`` (..., N, F), decay folded in as
    log gamma, and ``normalize=False``, each only when given; decay and log_gate checked."""
    xp = _checks.array_module(x_q)
    lead, shape = x_q.shape[:-2], x_q.shape
    decay = _checks.check_decay(decay, lead, x_q.dtype, xp)
    log_gate = _checks.check_log_gate(log_gate, shape, x_q.dtype, xp)
    kw = {} if normalize else {"normalize": False}
    if decay is None and log_gate is None:
        return kw, decay, log_gate
    g = xp.zeros(shape, dtype=x_q.dtype)
    if decay is not None:
        g += xp.log(xp.broadcast_to(decay, lead))[..., None, None]     # log gamma
    if log_gate is not None:
        g += log_gate
    return dict(kw, log_gate=g), decay, log_gate


def reduce_to(x, shape):
    """x summed over the axes it was broadcast along from ``shape``: the gradient of a
    broadcast."""
    extra = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(extra))) if extra else x
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def step_gate(decay, log_gate_t, phi_k):
    """One step's log gate (..., F): log gamma plus ``log_gate_t``, checked; None when
    neither is given."""
    xp = _checks.array_module(phi_k)
    decay = _checks.check_decay(decay, phi_k.shape[:-1], phi_k.dtype, xp)
    log_gate_t = _checks.check_log_gate(log_gate_t, phi_k.shape, phi_k.dtype, xp,
                                        name="log_gate_t")
    if decay is None and log_gate_t is None:
        return None
    g = xp.zeros(phi_k.shape, dtype=phi_k.dtype)
    if decay is not None:
        g += xp.log(xp.broadcast_to(decay, phi_k.shape[:-1]))[..., None]    # log gamma
    if log_gate_t is not None:
        g += log_gate_t
    return g
