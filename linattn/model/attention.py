"""Multi-head attention with Q/K/V/output projections, forward and backward.

The attention layer of Katharopoulos et al. (2020), arXiv:2006.16236: Q = x W_Q, K = x W_K,
V = x W_V (Eq. 2), split into H heads of width d_head, each head attending with softmax
(Eq. 2, causal mask of Eq. 8, ``linattn.softmax_attention``), linear attention (Eq. 5,
causal Eq. 9, ``linattn.linear_attention``) or Reformer (LSH) attention
(``linattn.lsh_attention``), heads concatenated and projected by W_O. ``cfg.causal``
chooses the decoder (causal) or the encoder (every position) form.

LSH attention shares queries and keys: Q = x W_Q serves as both (the keys are its unit
rows), W_K and b_K are left unused and get zero gradients, and dQK flows back into W_Q
only. Its hash rounds use the fixed seed ``LSH_SEED`` in every layer and step, so a forward
is deterministic. Causal LSH hides the values of later positions, but not their hashes:
they move the chunk boundaries, so an earlier output can change when a later token does.

Padded batches (the speech encoder): the core functions take no key padding mask, and
linear attention could not honour one by zeroing keys (elu+1 features are always positive).
So with ``lengths`` given, each sequence attends over its own first ``lengths[b]`` positions
in a call of its own, and padded positions get a zero output. The projections stay batched;
padded positions never reach real ones, since attention is the only layer that mixes
positions. Cost: B attention calls per layer instead of one.

Heads are laid out (batch, heads, N, d_head), so the core functions see leading axes only.
Reference: the core's own oracles; the layer's backward is held to finite differences in
tests/test_model_attention.py. This layer is the reference of the compiled path's
(``model.fast.attention``).
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
    heads : ndarray, shape (B, N, d_model) (the compiled path keeps (B N, d_model))
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
    return dict(n_hashes=cfg.n_hashes, chunk_size=cfg.lsh_chunk_size, causal=cfg.causal,
                seed=LSH_SEED)


def attend(q, k, v, cfg):
    """Attention per head, by ``cfg.attention``: softmax, Eq. (2) (with the mask of Eq. (8)
    if ``cfg.causal``), linear, Eq. (5) (Eq. (9) if ``cfg.causal``), or LSH (q shared with
    the keys, k unused).

    q, k, v (..., N, d_head) -> (..., N, d_head). Softmax costs O(N^2 d_head), linear
    O(N d_head^2), LSH O(n_hashes N C d_head) plus its hashing (``backend="auto"``: the
    fastest available backend).
    """
    if cfg.attention == "softmax":
        return softmax_attention(q, k, v, causal=cfg.causal)
    if cfg.attention == "lsh":
        return lsh_attention(q, v, **_lsh_options(cfg))
    return linear_attention(q, k, v, causal=cfg.causal, feature_map=cfg.feature_map,
                            backend="auto")


def attend_backward(dout, q, k, v, cfg):
    """Backward of ``attend``: (dq, dk, dv), from the core's hand-written backward passes;
    for LSH dq is dqk and dk is None."""
    if cfg.attention == "softmax":
        return softmax_attention_backward(dout, q, k, v, causal=cfg.causal)
    if cfg.attention == "lsh":
        dqk, dv = lsh_attention_backward(dout, q, v, **_lsh_options(cfg))
        return dqk, None, dv
    return linear_attention_backward(dout, q, k, v, causal=cfg.causal,
                                     feature_map=cfg.feature_map, backend="auto")


def attend_padded(q, k, v, cfg, lengths=None):
    """``attend`` on a padded batch: sequence b over its first ``lengths[b]`` positions only.

    q, k, v (B, H, N, d_head) -> (B, H, N, d_head), zero at padded positions. With
    ``lengths`` None every sequence is N long: one call of ``attend``.
    """
    if lengths is None:
        return attend(q, k, v, cfg)
    out = np.zeros_like(v)
    for b, n in enumerate(lengths):
        out[b, :, :n] = attend(q[b, :, :n], None if k is None else k[b, :, :n], v[b, :, :n],
                               cfg)
    return out


def attend_padded_backward(dout, q, k, v, cfg, lengths=None):
    """Backward of ``attend_padded``: (dq, dk, dv), zero at padded positions."""
    if lengths is None:
        return attend_backward(dout, q, k, v, cfg)
    grads = tuple(None if a is None else np.zeros_like(a) for a in (q, k, v))
    for b, n in enumerate(lengths):
        parts = attend_backward(dout[b, :, :n], q[b, :, :n],
                                None if k is None else k[b, :, :n], v[b, :, :n], cfg)
        for g, part in zip(grads, parts):
            if g is not None:
                g[b, :, :n] = part
    return grads


def attention(p, x, cfg, lengths=None):
    """Multi-head self-attention, causal or not by ``cfg.causal``.

    Parameters
    ----------
    p : dict
        ``wq, wk, wv, wo`` (d_model, d_model) and ``bq, bk, bv, bo`` (d_model,).
    x : ndarray, shape (B, N, d_model)
    cfg : ModelConfig
    lengths : sequence of int, optional
        Real positions per sequence of a padded batch; None: all N are real.

    Returns
    -------
    y : ndarray, shape (B, N, d_model)
    cache : AttentionCache

    Cost: O(B N d_model^2) for the projections plus the attention's cost per head.
    """
    q, k, v = (None if n == "k" and cfg.attention == "lsh"  # LSH: q is also the keys
               else split_heads(linear(x, p["w" + n], p["b" + n]), cfg.n_heads) for n in "qkv")
    heads = merge_heads(attend_padded(q, k, v, cfg, lengths))   # (B, N, d_model)
    return linear(heads, p["wo"], p["bo"]), AttentionCache(q, k, v, heads)


def attention_backward(dy, p, x, cache, cfg, lengths=None):
    """Backward of ``attention`` (``lengths`` as given to it).

    Returns
    -------
    dx : ndarray, shape (B, N, d_model)
    grads : dict
        Gradients of ``wq, bq, ..., wo, bo``, shaped like ``p``.
    """
    grads = {}
    dheads, grads["wo"], grads["bo"] = linear_backward(dy, cache.heads, p["wo"], p["bo"])
    dout = split_heads(dheads, cfg.n_heads)                   # (B, H, N, d_head)
    dqkv = attend_padded_backward(dout, cache.q, cache.k, cache.v, cfg, lengths)
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
