"""Multi-head causal attention with Q/K/V/output projections, forward and backward.

The attention layer of Katharopoulos et al. (2020), arXiv:2006.16236: Q = x W_Q, K = x W_K,
V = x W_V (Eq. 2), split into H heads of width d_head, each head attending causally with
softmax (Eq. 2 with the mask of Eq. 8, ``linattn.softmax_attention``), linear attention
(Eq. 9, ``linattn.linear_attention``) or Reformer (LSH) attention (``linattn.lsh_attention``),
heads concatenated and projected by W_O.

LSH attention shares queries and keys: Q = x W_Q serves as both (the keys are its unit
rows), W_K and b_K are left unused and get zero gradients, and dQK flows back into W_Q
only. Its hash rounds use the fixed seed ``LSH_SEED`` in every layer and step, so a forward
is deterministic. Causal LSH hides the values of later positions, but not their hashes:
they move the chunk boundaries, so an earlier output can change when a later token does.

Heads are laid out (batch, heads, N, d_head), so the core functions see leading axes only.
Reference: the core's own oracles; the layer's backward is held to finite differences in
tests/test_model_attention.py.
"""
from typing import NamedTuple

import numpy as np

from ..linear import linear_attention, linear_attention_backward
from ..lsh import lsh_attention, lsh_attention_backward
from ..softmax import softmax_attention, softmax_attention_backward
from .layers import linear, linear_backward

PROJECTIONS = ("q", "k", "v", "o")
LSH_SEED = 0


class AttentionCache(NamedTuple):
    """What the backward needs from the forward.

    q, k, v : ndarray, shape (B, H, N, d_head)
        The projected inputs, split into heads (k is None for LSH: q is shared).
    heads : ndarray, shape (B, N, d_model)
        The heads' outputs concatenated: the input of the output projection.
    """

    q: object
    k: object
    v: object
    heads: object


def split_heads(x, n_heads):
    """(B, N, d_model) -> (B, H, N, d_head)."""
    b, n, d = x.shape
    return x.reshape(b, n, n_heads, d // n_heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    """(B, H, N, d_head) -> (B, N, d_model), the inverse of ``split_heads``."""
    b, h, n, dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, n, h * dh)


def _lsh_options(cfg):
    return dict(n_hashes=cfg.n_hashes, chunk_size=cfg.lsh_chunk_size, causal=True,
                seed=LSH_SEED)


def attend(q, k, v, cfg):
    """Causal attention per head: Eq. (8) softmax, Eq. (9) linear or LSH (q shared with the
    keys, k unused), by ``cfg.attention``.

    q, k, v (..., N, d_head) -> (..., N, d_head). Softmax costs O(N^2 d_head), linear
    O(N d_head^2), LSH O(n_hashes N C d_head) plus its hashing (``backend="auto"``: the
    fastest available backend).
    """
    if cfg.attention == "softmax":
        return softmax_attention(q, k, v, causal=True)
    if cfg.attention == "lsh":
        return lsh_attention(q, v, **_lsh_options(cfg))
    return linear_attention(q, k, v, causal=True, feature_map=cfg.feature_map, backend="auto")


def attend_backward(dout, q, k, v, cfg):
    """Backward of ``attend``: (dq, dk, dv), from the core's hand-written backward passes;
    for LSH dq is dqk and dk is None."""
    if cfg.attention == "softmax":
        return softmax_attention_backward(dout, q, k, v, causal=True)
    if cfg.attention == "lsh":
        dqk, dv = lsh_attention_backward(dout, q, v, **_lsh_options(cfg))
        return dqk, None, dv
    return linear_attention_backward(dout, q, k, v, causal=True,
                                     feature_map=cfg.feature_map, backend="auto")


def attention(p, x, cfg):
    """Multi-head causal self-attention.

    Parameters
    ----------
    p : dict
        ``wq, wk, wv, wo`` (d_model, d_model) and ``bq, bk, bv, bo`` (d_model,).
    x : ndarray, shape (B, N, d_model)
    cfg : ModelConfig

    Returns
    -------
    y : ndarray, shape (B, N, d_model)
    cache : AttentionCache

    Cost: O(B N d_model^2) for the projections plus the attention's cost per head.
    """
    q, k, v = (None if n == "k" and cfg.attention == "lsh"  # LSH: q is also the keys
               else split_heads(linear(x, p["w" + n], p["b" + n]), cfg.n_heads) for n in "qkv")
    heads = merge_heads(attend(q, k, v, cfg))                 # (B, N, d_model)
    return linear(heads, p["wo"], p["bo"]), AttentionCache(q, k, v, heads)


def attention_backward(dy, p, x, cache, cfg):
    """Backward of ``attention``.

    Returns
    -------
    dx : ndarray, shape (B, N, d_model)
    grads : dict
        Gradients of ``wq, bq, ..., wo, bo``, shaped like ``p``.
    """
    grads = {}
    dheads, grads["wo"], grads["bo"] = linear_backward(dy, cache.heads, p["wo"], p["bo"])
    dout = split_heads(dheads, cfg.n_heads)                   # (B, H, N, d_head)
    dqkv = attend_backward(dout, cache.q, cache.k, cache.v, cfg)
    dx = 0
    for name, dh in zip("qkv", dqkv):
        if dh is None:                                        # LSH: W_K unused
            grads["w" + name], grads["b" + name] = (np.zeros_like(p["w" + name]),
                                                    np.zeros_like(p["b" + name]))
            continue
        # the projections read the same x: their input gradients add
        dxn, grads["w" + name], grads["b" + name] = linear_backward(
            merge_heads(dh), x, p["w" + name], p["b" + name])
        dx = dx + dxn
    return dx, grads
