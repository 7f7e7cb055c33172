"""The model's attention beyond the paper: a learned decay, GLA's gates and the delta rule.

Causal linear attention (Katharopoulos et al. (2020), arXiv:2006.16236, Eq. (9), as an RNN
Eq. (16)-(20)) adds phi(k_i) v_i^T to its state at every position and forgets nothing. Three
causal variants let a layer forget, each from parameters of its own, and each computed by
the library's public functions (``linattn.linear_attention`` with ``decay`` or ``log_gate``,
``linattn.delta_rule_attention``) and their hand-written backward passes:

- ``"decay"``: S_i = gamma_h S_{i-1} + phi(k_i) v_i^T (z likewise), one gamma per head,
  learned: gamma_h = sigmoid(a_h), parameter ``decay_logit`` (H,). A learned decay rather
  than RetNet's fixed schedule gamma_h = 1 - 2^(-5-h) (Sun et al. 2023), so that training
  uses the gradient the library returns for the decay; it starts at that schedule,
  a_h = log(2^(5+h) - 1), so the heads begin with memories of about 32, 64, 128, ...
  positions. The paper's normaliser stays (out_i = phi(q_i)^T S_i / (phi(q_i)^T z_i + eps)).
- ``"gated"``: GLA's gate (Yang et al. 2023), one per position and per feature of each head,
  read from the layer's input x: log_gate = logsigmoid(x W_gate + b_gate) / tau, tau =
  ``GATE_TEMPERATURE``, and S_i = diag(exp(g_i)) S_{i-1} + phi(k_i) v_i^T. Parameters
  ``w_gate`` (d_model, H F) and ``b_gate`` (H F,), F the feature map's width (F = d_head for
  elu+1 and relu).
- ``"delta"``: the delta rule (Schlag et al. 2021; DeltaNet, Yang et al. 2024),
  S_t = S_{t-1} + beta_t k~_t (v_t - S_{t-1}^T k~_t)^T, out_t = S_t^T q~_t with unit
  features k~, q~ (the library normalises phi(k) and phi(q)), the write strength
  beta = sigmoid(x W_beta + b_beta) per position and head. Parameters ``w_beta``
  (d_model, H) and ``b_beta`` (H,).

Each variant's parameters enter through one pre-activation ``a``: ``decay_logit`` itself
(H,), or the projection of x, (B, H, N, F) for the gates and (B, H, N) for beta. ``gate``
turns it into what the library takes, ``gate_backward`` carries the library's gradient
(ddecay, dlog_gate, dbeta) back to it, and ``gate_input_backward`` to the projection's
weights and to x.

They call the library with ``backend="auto"``, as the rest of the reference model does
(where numba imports: training runs Numba's gated loops and the delta rule's compiled
chunks; generation steps with NumPy's gated step and Numba's delta-rule step), each held to
NumPy's oracle by the library's tests. The compiled path (``model.fast``) has none of
them: ``model.paths`` routes a model with one of them to the reference, and the compiled
functions refuse it.
Reference: the attention layer's gradient and the whole model's are held to central finite
differences, and generation by steps to the parallel forward, in tests/test_model_variants.py.
"""
import numpy as np

from ..delta import delta_rule_attention, delta_rule_attention_backward, delta_rule_step
from ..feature_maps import get_feature_map
from ..linear import linear_attention, linear_attention_backward, linear_attention_step
from .layers import (linear, linear_backward, log_sigmoid, log_sigmoid_backward, sigmoid,
                     sigmoid_backward)

GATE_TEMPERATURE = 16.0        # GLA's tau: log gates near log(1/2) / 16 at init, gates ~0.96
BACKEND = "auto"               # the fastest backend that takes the call, as model.attention


def feature_width(cfg):
    """F, the width of ``cfg.feature_map``'s features for queries of width d_head."""
    return get_feature_map(cfg.feature_map).forward(np.zeros((1, cfg.d_head))).shape[-1]


def init_variant(normal, cfg):
    """The variant's parameters by short name, weights drawn by ``normal(shape, std)``:
    ``decay_logit`` (H,) at RetNet's schedule, log(2^(5+h) - 1), so sigmoid gives
    gamma_h = 1 - 2^(-5-h); ``w_gate`` (d_model, H F) and ``w_beta`` (d_model, H) with std
    1/sqrt(d_model), their biases 0 (gates exp(log(1/2) / tau) and beta = 1/2 on average)."""
    d, h = cfg.d_model, cfg.n_heads
    if cfg.attention == "decay":
        return {"decay_logit": np.log(2.0 ** (5 + np.arange(h)) - 1)}
    if cfg.attention == "gated":
        f = feature_width(cfg)
        return {"w_gate": normal((d, h * f), d**-0.5), "b_gate": np.zeros(h * f)}
    return {"w_beta": normal((d, h), d**-0.5), "b_beta": np.zeros(h)}


def _heads(y, n_heads):
    """(B, N, H W) -> (B, H, N, W): the projection split per head."""
    b, n, hw = y.shape
    return y.reshape(b, n, n_heads, hw // n_heads).transpose(0, 2, 1, 3)


def gate_input(p, x, cfg):
    """The variant's pre-activation a: ``decay_logit`` (H,), or from x (B, N, d_model) the
    gate's x W_gate + b_gate as (B, H, N, F), or beta's x W_beta + b_beta as (B, H, N)."""
    if cfg.attention == "decay":
        return p["decay_logit"]
    if cfg.attention == "gated":
        return _heads(linear(x, p["w_gate"], p["b_gate"]), cfg.n_heads)
    return _heads(linear(x, p["w_beta"], p["b_beta"]), cfg.n_heads)[..., 0]


def gate_input_backward(da, p, x, cfg):
    """Backward of ``gate_input``: (dx, grads by short name); dx is 0 for the decay, which
    does not read x."""
    if cfg.attention == "decay":
        return 0, {"decay_logit": da}
    name = "gate" if cfg.attention == "gated" else "beta"
    if cfg.attention == "delta":
        da = da[..., None]                                   # (B, H, N, 1)
    b, h, n, w = da.shape
    dy = da.transpose(0, 2, 1, 3).reshape(b, n, h * w)       # (B, N, H W), heads joined
    dx, dw, db = linear_backward(dy, x, p["w_" + name], p["b_" + name])
    return dx, {"w_" + name: dw, "b_" + name: db}


def gate(a, cfg):
    """What the library takes from the pre-activation: gamma = sigmoid(a) (H,),
    log_gate = logsigmoid(a) / tau (B, H, N, F), or beta = sigmoid(a) (B, H, N)."""
    if cfg.attention == "gated":
        return log_sigmoid(a) / a.dtype.type(GATE_TEMPERATURE)
    return sigmoid(a)


def gate_backward(dg, a, cfg):
    """Backward of ``gate``: da from dgamma, dlog_gate or dbeta (returned as (da,))."""
    if cfg.attention == "gated":
        return log_sigmoid_backward(dg / a.dtype.type(GATE_TEMPERATURE), a)
    return sigmoid_backward(dg, a)


def _linear_keywords(cfg, g):
    """The keyword that carries the decay or the gate to the library's linear attention."""
    return {"decay": g} if cfg.attention == "decay" else {"log_gate": g}


def attend(q, k, v, a, cfg, return_state=False):
    """The variant's causal attention per head: q, k, v (B, H, N, d_head) and the
    pre-activation a -> out (B, H, N, d_head), and the state after the last position with
    ``return_state`` (``State(S, z)`` for decay and gated, S (B, H, F, d_head) for delta).

    Cost: O(B H N F d_head) (the library's gated running sums or the delta rule's chunks).
    """
    g = gate(a, cfg)
    if cfg.attention == "delta":
        return delta_rule_attention(q, k, v, g, feature_map=cfg.feature_map, backend=BACKEND,
                                    return_state=return_state)
    return linear_attention(q, k, v, causal=True, feature_map=cfg.feature_map,
                            backend=BACKEND, return_state=return_state,
                            **_linear_keywords(cfg, g))


def attend_backward(dout, q, k, v, a, cfg):
    """Backward of ``attend``: (dq, dk, dv, da), from the library's backward (its ddecay,
    dlog_gate or dbeta) and ``gate_backward``."""
    g = gate(a, cfg)
    if cfg.attention == "delta":
        dq, dk, dv, dg = delta_rule_attention_backward(dout, q, k, v, g,
                                                       feature_map=cfg.feature_map,
                                                       backend=BACKEND)
    else:
        dq, dk, dv, dg = linear_attention_backward(dout, q, k, v, causal=True,
                                                   feature_map=cfg.feature_map,
                                                   backend=BACKEND,
                                                   **_linear_keywords(cfg, g))
    (da,) = gate_backward(dg, a, cfg)
    return dq, dk, dv, da


def step(q_t, k_t, v_t, a_t, memory, cfg):
    """One position of ``attend``, the variant as an RNN: q_t, k_t, v_t (B, H, d_head), the
    pre-activation a_t of this position (``decay_logit`` (H,), (B, H, F) or (B, H)) and the
    memory after the previous positions (None: zero) -> (out_t (B, H, d_head), memory).
    ``linattn.linear_attention_step`` with the decay or the gate, or
    ``linattn.delta_rule_step``. Cost: O(B H F d_head)."""
    g = gate(a_t, cfg)
    if cfg.attention == "delta":
        return delta_rule_step(q_t, k_t, v_t, g, memory, feature_map=cfg.feature_map,
                               backend=BACKEND)
    keywords = {"decay": g} if cfg.attention == "decay" else {"log_gate_t": g}
    return linear_attention_step(q_t, k_t, v_t, memory, feature_map=cfg.feature_map,
                                 backend=BACKEND, **keywords)
