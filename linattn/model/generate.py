"""Autoregressive generation three ways, section 3.4 and 4.2 of Katharopoulos et al. (2020),
arXiv:2006.16236.

- ``"recurrent"`` (linear models): the transformer as an RNN. Each layer and head carries
  its state (S, z) of the RNN, Eq. (16)-(20); a new token costs one RNN step per layer,
  O(d_model^2 + d_model d_head) time and constant memory, whatever its position.
- ``"cache"`` (softmax models): keys and values of earlier positions are kept, and the new
  query attends to them: O(t d_model) time and memory at position t.
- ``"recompute"`` (any attention): the whole prefix goes through ``transformer.forward``
  again for every token, O(t^2 d_model) at position t for softmax. This is the reference:
  the fast forms must pick token for token what it picks. It is the only form for LSH
  (Reformer) models, which have no constant-size state and no valid cache: every new token
  is hashed and sorted with the others, which moves the chunk boundaries, so the outputs of
  earlier positions (and the next layer's keys built from them) can change. Recomputing the
  prefix is the one exact way; it costs O(t (d_model^2 + n_hashes C d_model)) plus the
  hashing at position t.

``step`` computes one token of the first two with the NumPy layers and the library's
public attention (``linear_attention_step``, ``softmax_attention``): the reference.
``generate`` runs them through ``model.decode``, the same arithmetic organised for speed
(weights prepared once, buffers reused, one ``linattn.Recurrence`` per layer, compiled
element work): tests/test_model_generate.py holds it to ``step``, logits within rounding
in float64 and the same tokens, greedy or sampled.
"""
from typing import NamedTuple

import numpy as np

from ..linear import linear_attention_step
from ..softmax import softmax_attention
from .fast import decode
from .attention import merge_heads, split_heads
from .layers import layer_norm, linear
from .transformer import block_params, embed, forward, mlp

METHODS = ("auto", "recurrent", "cache", "recompute")


class KVCache(NamedTuple):
    """Keys and values of one softmax layer, (B, H, N_max, d_head) each; positions up to
    the current one are filled. The generation loop owns it and writes one row per token."""

    k: np.ndarray
    v: np.ndarray


def _attend_one(p, h, cfg, memory, t):
    """Attention output for position t alone: h (B, 1, d_model) -> (B, 1, d_model), and the
    updated memory (a ``State`` for linear attention, a ``KVCache`` for softmax)."""
    q, k, v = (split_heads(linear(h, p["w" + n], p["b" + n]), cfg.n_heads) for n in "qkv")
    if cfg.attention == "linear":
        # Eq. (18)-(20): S_t = S_{t-1} + phi(k_t) v_t^T, z_t = z_{t-1} + phi(k_t), readout
        out, memory = linear_attention_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], memory,
                                            feature_map=cfg.feature_map)
        out = out[:, :, None, :]                                  # (B, H, 1, d_head)
    else:
        memory.k[:, :, t], memory.v[:, :, t] = k[:, :, 0], v[:, :, 0]
        # the last row of causal softmax, Eq. (8): one query against the keys of 0..t, all
        # visible, so no mask: cross-attention with Nq = 1, O(t d_head)
        out = softmax_attention(q, memory.k[:, :, :t + 1], memory.v[:, :, :t + 1])
    return linear(merge_heads(out), p["wo"], p["bo"]), memory


def step(params, cfg, tokens, t, memories):
    """Next-token logits from the token at position t and each layer's memory.

    Parameters
    ----------
    tokens : ndarray of int, shape (B,)
    t : int, the position of ``tokens``
    memories : tuple, one per layer: ``State`` or None (linear), ``KVCache`` (softmax)

    Returns
    -------
    logits : ndarray, shape (B, vocab_size)
    memories : tuple, updated
    """
    x = embed(params, cfg, tokens[:, None], start=t)              # (B, 1, d_model)
    new = []
    for layer, memory in enumerate(memories):
        p = block_params(params, layer)
        a, memory = _attend_one(p, layer_norm(x, p["ln1_g"], p["ln1_b"]), cfg, memory, t)
        x = x + a
        x = x + mlp(p, layer_norm(x, p["ln2_g"], p["ln2_b"]), cfg)[0]
        new.append(memory)
    h = layer_norm(x[:, 0], params["lnf_g"], params["lnf_b"])
    return linear(h, params["w_out"], params["b_out"]), tuple(new)


def sample(logits, temperature, rng):
    """One token per row: the argmax if ``temperature`` is 0, else a draw from
    softmax(logits / temperature) (computed in float64). logits (B, V) -> (B,) ints."""
    if temperature == 0:
        return logits.argmax(axis=-1)
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    cdf = np.cumsum(p, axis=-1)
    u = rng.random((logits.shape[0], 1)) * cdf[:, -1:]            # inverse-CDF sampling
    return np.minimum((cdf < u).sum(axis=-1), logits.shape[-1] - 1)


def _resolve(method, cfg):
    if not cfg.causal:
        raise ValueError("generation needs a causal model; this one (causal=False) is an "
                         "encoder whose every position reads the whole sequence")
    if method not in METHODS:
        raise ValueError(f"unknown generation method {method!r}; valid: {', '.join(METHODS)}")
    if method == "auto":
        return {"linear": "recurrent", "softmax": "cache"}.get(cfg.attention, "recompute")
    fits = {"recurrent": "linear", "cache": "softmax"}.get(method, cfg.attention)
    if fits != cfg.attention:
        raise ValueError(f"method {method!r} does not apply to {cfg.attention} attention: "
                         "use 'recurrent' for linear, 'cache' for softmax, or 'recompute' "
                         "(the only form for lsh)")
    return method


def generate(params, cfg, prompt, n_new, *, method="auto", temperature=0.0, seed=0):
    """Continue ``prompt`` by ``n_new`` tokens.

    Parameters
    ----------
    params : dict, cfg : ModelConfig
    prompt : ndarray of int, shape (B, P), P >= 1
    n_new : int
    method : {"auto", "recurrent", "cache", "recompute"}
        "auto" is "recurrent" for linear attention, "cache" for softmax and "recompute"
        for lsh.
    temperature : float
        0 decodes greedily; otherwise tokens are sampled from softmax(logits / temperature).
    seed : int
        Seed of the sampling.

    Returns
    -------
    tokens : ndarray of int, shape (B, P + n_new), the prompt followed by the new tokens.

    Cost per new token at position t: O(d_model^2) plus O(d_model d_head) (recurrent),
    O(t d_model) (cache) or O(t d_model^2 + t^2 d_model) (recompute, softmax).
    """
    method = _resolve(method, cfg)
    prompt = np.asarray(prompt)
    if prompt.ndim != 2 or prompt.shape[1] < 1 or prompt.dtype.kind not in "iu":
        raise ValueError(f"prompt must be integer ids of shape (B, P >= 1), got "
                         f"{prompt.dtype} {prompt.shape}")
    if not (isinstance(temperature, (int, float)) and temperature >= 0):
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    b, n_prompt = prompt.shape
    total = n_prompt + n_new
    if n_new < 0 or max(n_prompt, total - 1) > cfg.max_len:
        # the model reads every token but the last one generated
        raise ValueError(f"prompt length {n_prompt} + n_new {n_new} - 1 must be at most "
                         f"max_len {cfg.max_len} (and n_new >= 0)")
    if prompt.min() < 0 or prompt.max() >= cfg.vocab_size:
        raise ValueError(f"prompt ids must lie in [0, {cfg.vocab_size}), got "
                         f"[{prompt.min()}, {prompt.max()}]")
    rng = np.random.default_rng(seed)
    tokens = np.zeros((b, total), dtype=np.int64)
    tokens[:, :n_prompt] = prompt
    if method == "recompute":
        for t in range(n_prompt, total):
            logits, _ = forward(params, cfg, tokens[:, :t])
            tokens[:, t] = sample(logits[:, -1], temperature, rng)
        return tokens
    # the lean loop: what ``step`` computes, with everything but the token's own work done
    # once here (the model reads positions 0..total-2)
    weights = decode.prepare(params, cfg, total - 1)
    buf = decode.buffers(cfg, b, total - 1)
    memories = decode.memories(cfg, b, total - 1)      # s_0 = z_0 = 0 (Eq. 16-17), or empty
    for t in range(total - 1):                          # the prompt primes the memories
        logits = decode.token_logits(weights, buf, memories, cfg, tokens[:, t], t)
        if t + 1 >= n_prompt:
            tokens[:, t + 1] = sample(logits, temperature, rng)
    return tokens
