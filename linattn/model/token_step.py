"""One generated token by the reference layers: the transformer as an RNN (linear attention)
or over a key/value cache (softmax), section 3.4 of Katharopoulos et al. (2020),
arXiv:2006.16236.

``step`` computes the next-token logits from one token and each layer's memory with the
NumPy layers and the library's public attention (``linear_attention_step``, Eq. (16)-(20);
``softmax_attention`` over the cache, Eq. (8)): the reference generation path.
``next_logits`` runs it over a sequence for ``generate``. The compiled path computes the
same (``model.fast.token_loop``); tests/test_model_generate.py holds the two together, and
both to recomputing the parallel form (``transformer.forward``).
"""
from typing import NamedTuple

import numpy as np

from ..linear import linear_attention_step
from ..softmax import softmax_attention
from .attention import merge_heads, split_heads
from .layers import layer_norm, linear
from .transformer import block_params, embed, mlp


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


def empty_memories(cfg, b, n_positions):
    """``step``'s memories before the first token, for b sequences of up to n_positions:
    None per layer for linear attention (S_0 = 0, z_0 = 0, Eq. 16-17), or an empty
    ``KVCache`` per layer for softmax."""
    if cfg.attention == "linear":
        return (None,) * cfg.n_layers
    shape = (b, cfg.n_heads, n_positions, cfg.d_head)
    return tuple(KVCache(np.zeros(shape, cfg.dtype), np.zeros(shape, cfg.dtype))
                 for _ in range(cfg.n_layers))


def next_logits(params, cfg, tokens):
    """Yield the next-token logits (B, V) of positions t = 0..N-2 of ``tokens`` (B, N), one
    ``step`` each, reading ``tokens[:, t]`` only when asked for position t's logits: the
    caller may write the token it samples at t + 1 in between."""
    b, n = tokens.shape
    memories = empty_memories(cfg, b, n - 1)
    for t in range(n - 1):
        logits, memories = step(params, cfg, tokens[:, t], t, memories)
        yield logits
