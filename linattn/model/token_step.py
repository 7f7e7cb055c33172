"""One generated token by the reference layers: the transformer as an RNN (linear attention)
or over a key/value cache (softmax), section 3.4 of Katharopoulos et al. (2020),
arXiv:2006.16236.

``step`` computes the next-token logits from one token and each layer's memory with the
NumPy layers and the library's public attention (``linear_attention_step``, Eq. (16)-(20);
``softmax_attention`` over the cache, Eq. (8)): the reference generation path.
``next_logits`` runs it over a sequence for ``generate``, from the memories of the prompt
that ``prefill.read_prompt`` reads in one parallel pass per layer. The compiled path
computes the
same (``model.fast.token_loop``); tests/test_model_generate.py holds the two together, and
both to recomputing the parallel form (``transformer.forward``). The variants beyond the
paper step by ``variants.step`` (``linear_attention_step`` with the decay or the gate,
``delta_rule_step``), on this path only.
"""
from typing import NamedTuple

import numpy as np

from ..linear import linear_attention_step
from ..softmax import softmax_attention
from . import variants
from .attention import merge_heads, split_heads
from .config import VARIANTS
from .layers import layer_norm, linear
from .prefill import read_prompt
from .transformer import block_params, embed, mlp


class KVCache(NamedTuple):
    """Keys and values of one softmax layer, (B, H, N_max, d_head) each; positions up to
    the current one are filled. The generation loop owns it and writes one row per token."""

    k: np.ndarray
    v: np.ndarray


def _attend_one(p, h, cfg, memory, t):
    """Attention output for position t alone: h (B, 1, d_model) -> (B, 1, d_model), and the
    updated memory (a ``State`` for linear attention, a ``KVCache`` for softmax, the
    variant's state for the others)."""
    q, k, v = (split_heads(linear(h, p["w" + n], p["b" + n]), cfg.n_heads) for n in "qkv")
    if cfg.attention in VARIANTS:
        # this position's decay, gate or write strength, then one step of the variant's RNN
        a = variants.gate_input(p, h, cfg)
        a_t = a if cfg.attention == "decay" else a[:, :, 0]
        out, memory = variants.step(q[:, :, 0], k[:, :, 0], v[:, :, 0], a_t, memory, cfg)
        out = out[:, :, None, :]                                  # (B, H, 1, d_head)
    elif cfg.attention == "linear":
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
    memories : tuple, one per layer: ``State`` or None (linear, "decay", "gated"), S or
        None ("delta"), ``KVCache`` (softmax)

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
    None per layer for linear attention and the variants (S_0 = 0, z_0 = 0, Eq. 16-17), or
    an empty ``KVCache`` per layer for softmax."""
    if cfg.attention != "softmax":
        return (None,) * cfg.n_layers
    shape = (b, cfg.n_heads, n_positions, cfg.d_head)
    return tuple(KVCache(np.zeros(shape, cfg.dtype), np.zeros(shape, cfg.dtype))
                 for _ in range(cfg.n_layers))


def prompt_memories(params, cfg, ids, n_positions):
    """``step``'s memories after the positions 0..P-1 of ``ids`` (B, P), read in one parallel
    pass per layer (``prefill.read_prompt``): the RNN's states (linear), or caches with room
    for n_positions and the prompt's keys and values in their first P rows (softmax). P = 0
    gives ``empty_memories``."""
    b, n_read = ids.shape
    memories = empty_memories(cfg, b, n_positions)
    if n_read == 0:
        return memories
    read = read_prompt(params, cfg, ids)
    if cfg.attention != "softmax":
        return read
    for memory, (k, v) in zip(memories, read):
        memory.k[:, :, :n_read], memory.v[:, :, :n_read] = k, v
    return memories


def next_logits(params, cfg, tokens, n_prompt=1):
    """Yield the next-token logits (B, V) of positions t = n_prompt-1..N-2 of ``tokens``
    (B, N), one ``step`` each, reading ``tokens[:, t]`` only when asked for position t's
    logits: the caller may write the token it samples at t + 1 in between. The positions
    before, 0..n_prompt-2, are read at once by ``prompt_memories``."""
    b, n = tokens.shape
    memories = prompt_memories(params, cfg, tokens[:, :n_prompt - 1], n - 1)
    for t in range(n_prompt - 1, n - 1):
        logits, memories = step(params, cfg, tokens[:, t], t, memories)
        yield logits
