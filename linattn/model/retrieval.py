"""Associative retrieval: how many key/value pairs one attention layer can store and recall.

The synthetic task of Schlag, Irie and Schmidhuber (2021), "Linear Transformers Are Secretly
Fast Weight Programmers", section 6.1, in our own small form: a sequence shows P pairs
(key, value), each at one position, the P keys distinct and drawn from ``n_keys`` symbols,
the values from ``n_values``; then ``n_queries`` positions each show one of the stored keys
and must answer its value. One attention layer sits between the embeddings and the answer:

    x_t = E_key[key_t] + E_value[value_t]      (a pair)     x_t = E_key[key_t] + e_query  (a query)
    q, k, v = x W_q, x W_k, x W_v              (N, d) each, one head of width d
    o = attention(q, k, v)                     causal; the queries write nothing (below)
    logits_t = o_t W_out + b_out               at the query positions only

With linear attention (Katharopoulos et al. (2020), Eq. (16)-(20)) the layer's memory is the
state S_P = sum_t phi(k_t) v_t^T, an F x M matrix: the question is how it fares once P
passes F. The attentions compared:

- ``"softmax"``: Eq. (2) with the causal mask; its memory grows with P (the N x N matrix).
- ``"linear"``: the sum rule of Eq. (18), elu+1 features, the paper's normaliser.
- ``"decay"``: the same with S_t = gamma S_{t-1} + phi(k_t) v_t^T, gamma = sigmoid(a) learned,
  starting at 1 - 1/64.
- ``"delta"``: the delta rule, S_t = S_{t-1} + beta_t k~_t (v_t - S_{t-1}^T k~_t)^T with unit
  features k~ (``linattn.delta_rule_attention``), beta_t = sigmoid(x_t w_beta + b_beta).

The queries are the last positions; they must not write into the memory, or each query
would disturb the next. Softmax, linear and decay read them as padded keys (``key_mask``
False there); the delta rule gets beta = 0 there. Every gradient is hand-written: the
library's ``*_backward`` functions for the attention, and the matrix products' by hand;
``loss_and_grads`` is held to central finite differences in tests/test_retrieval.py.
"""
from typing import NamedTuple

import numpy as np

from ..delta import delta_rule_attention, delta_rule_attention_backward
from ..linear import linear_attention, linear_attention_backward
from ..softmax import softmax_attention, softmax_attention_backward
from .layers import cross_entropy, cross_entropy_backward, sigmoid, sigmoid_backward
from .optim import AdamConfig, adam_init, adam_update
from .tasks import batch_rng

ATTENTIONS = ("softmax", "linear", "decay", "delta")
DECAY_INIT = 1 - 1 / 64                     # gamma before training: a memory of ~64 positions
BACKEND = "auto"                            # the fastest form each call supports


class RetrievalTask(NamedTuple):
    """P = ``pairs`` pairs, then ``n_queries`` queries of stored keys (drawn with
    replacement). A batch: ``keys`` (B, N) key ids, ``values`` (B, P) value ids of the
    pairs, ``targets`` (B, n_queries) the values the queries ask for; N = P + n_queries."""

    pairs: int
    n_keys: int = 128
    n_values: int = 16
    n_queries: int = 8

    def batch(self, rng, batch_size):
        if not 1 <= self.pairs <= self.n_keys:
            raise ValueError(f"pairs must be in 1..n_keys={self.n_keys}, got {self.pairs}")
        keys = np.argsort(rng.random((batch_size, self.n_keys)), axis=1)[:, :self.pairs]
        values = rng.integers(0, self.n_values, size=(batch_size, self.pairs))
        asked = rng.integers(0, self.pairs, size=(batch_size, self.n_queries))
        rows = np.arange(batch_size)[:, None]
        return (np.concatenate([keys, keys[rows, asked]], axis=1), values,
                values[rows, asked])


def init_params(attention, d, task, seed=0):
    """The layer's parameters, float64, weights N(0, 1/d) and embeddings N(0, 1)."""
    if attention not in ATTENTIONS:
        raise ValueError(f"unknown attention {attention!r}; valid names are "
                         f"{', '.join(ATTENTIONS)}")
    rng = np.random.default_rng(seed)
    p = {"e_key": rng.standard_normal((task.n_keys, d)),
         "e_value": rng.standard_normal((task.n_values, d)),
         "e_query": rng.standard_normal(d),
         **{name: rng.standard_normal((d, d)) / np.sqrt(d) for name in ("w_q", "w_k", "w_v")},
         "w_out": rng.standard_normal((d, task.n_values)) / np.sqrt(d),
         "b_out": np.zeros(task.n_values)}
    if attention == "decay":
        p["decay_logit"] = np.array(np.log(DECAY_INIT / (1 - DECAY_INIT)))
    if attention == "delta":
        p["w_beta"], p["b_beta"] = rng.standard_normal(d) / np.sqrt(d), np.zeros(())
    return p


def _inputs(p, keys, values):
    """x (B, N, d): pairs then queries."""
    n_pairs = values.shape[1]
    x = p["e_key"][keys]
    x[:, :n_pairs] += p["e_value"][values]
    x[:, n_pairs:] += p["e_query"]
    return x


def loss_and_grads(p, attention, task, keys, values, targets):
    """Mean cross-entropy of the queries' answers (nats) and its gradient for every
    parameter of ``p``, by hand. Returns (loss, grads, accuracy)."""
    b, n = keys.shape
    n_pairs = task.pairs
    x = _inputs(p, keys, values)                                    # (B, N, d)
    q, k, v = x @ p["w_q"], x @ p["w_k"], x @ p["w_v"]              # (B, N, d)
    writes = np.broadcast_to(np.arange(n) < n_pairs, (b, n))        # (B, N): pairs only
    if attention == "delta":
        pre = x @ p["w_beta"] + p["b_beta"]                         # (B, N)
        beta = sigmoid(pre) * writes
        o = delta_rule_attention(q, k, v, beta, backend=BACKEND)
    else:
        kw = dict(causal=True, key_mask=writes, backend=BACKEND)
        if attention == "decay":
            kw["decay"] = sigmoid(p["decay_logit"])
        call = softmax_attention if attention == "softmax" else linear_attention
        o = call(q, k, v, **kw)
    o_q = o[:, n_pairs:]                                            # (B, Q, d)
    logits = o_q @ p["w_out"] + p["b_out"]                          # (B, Q, n_values)
    loss = cross_entropy(logits, targets)
    accuracy = float((logits.argmax(axis=-1) == targets).mean())

    (dlogits,) = cross_entropy_backward(1.0, logits, targets)
    g = {"w_out": np.einsum("bqd,bqv->dv", o_q, dlogits), "b_out": dlogits.sum(axis=(0, 1))}
    do = np.zeros_like(o)
    do[:, n_pairs:] = dlogits @ p["w_out"].T
    if attention == "delta":
        dq, dk, dv, dbeta = delta_rule_attention_backward(do, q, k, v, beta, backend=BACKEND)
        (dpre,) = sigmoid_backward(dbeta * writes, pre)             # (B, N)
        g["w_beta"], g["b_beta"] = np.einsum("bnd,bn->d", x, dpre), np.array(dpre.sum())
    elif attention == "softmax":
        dq, dk, dv = softmax_attention_backward(do, q, k, v, **kw)
    else:
        grads = linear_attention_backward(do, q, k, v, **kw)
        dq, dk, dv = grads[:3]
        if attention == "decay":
            g["decay_logit"] = np.asarray(sigmoid_backward(grads[3], p["decay_logit"])[0])
    dx = dq @ p["w_q"].T + dk @ p["w_k"].T + dv @ p["w_v"].T         # (B, N, d)
    for name, dy in (("w_q", dq), ("w_k", dk), ("w_v", dv)):
        g[name] = np.einsum("bnd,bne->de", x, dy)
    if attention == "delta":
        dx += dpre[..., None] * p["w_beta"]
    g["e_key"] = np.zeros_like(p["e_key"])
    np.add.at(g["e_key"], keys, dx)
    g["e_value"] = np.zeros_like(p["e_value"])
    np.add.at(g["e_value"], values, dx[:, :n_pairs])
    g["e_query"] = dx[:, n_pairs:].sum(axis=(0, 1))
    return loss, g, accuracy


class RetrievalConfig(NamedTuple):
    """Training: ``steps`` Adam updates of ``batch_size`` sequences; the layer's width d;
    evaluation on ``eval_batches`` held-out batches (the held-out stream of
    ``tasks.batch_rng``)."""

    d: int = 32
    steps: int = 1500
    batch_size: int = 32
    eval_batches: int = 8
    seed: int = 0
    adam: AdamConfig = AdamConfig(lr=3e-3)


def train(attention, task, cfg=RetrievalConfig()):
    """Train one layer on ``task`` and return (params, held-out loss, held-out accuracy)."""
    p = init_params(attention, cfg.d, task, cfg.seed)
    state = adam_init(p)
    for step in range(cfg.steps):
        batch = task.batch(batch_rng(cfg.seed, step), cfg.batch_size)
        _, grads, _ = loss_and_grads(p, attention, task, *batch)
        p, state, _ = adam_update(p, grads, state, cfg.adam)
    results = [loss_and_grads(p, attention, task,
                              *task.batch(batch_rng(cfg.seed, i, stream=1), cfg.batch_size))
               for i in range(cfg.eval_batches)]
    return p, float(np.mean([r[0] for r in results])), float(np.mean([r[2] for r in results]))
