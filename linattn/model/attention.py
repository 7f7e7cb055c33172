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

Padded batches (the speech encoder): with ``lengths`` given, sequence b holds
``lengths[b]`` real positions, then padding. Softmax and linear attention take them as the
core's ``key_lengths`` in one call for the whole batch: a padded key adds nothing to any
sum, whatever it holds, and the outputs at padded queries are set to 0 (their upstream
gradient too, in the backward). LSH attention keeps one call per sequence over its own
positions: its default bucket count, 2 ceil(N / C), follows the width of the call, so in
one padded call a sequence would be hashed as it is not alone. Either way padded positions
never reach real ones, since attention is the only layer that mixes positions.

The causal variants beyond the paper ("decay", "gated", "delta") attend by
``model.variants``: a decay per head, or a gate or write strength read from the layer's
input x by a projection of its own, its gradient carried back to x and to its weights.

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
from . import variants
from .config import VARIANTS
from .layers import linear, linear_backward

PROJECTIONS = ("q", "k", "v", "o")
LSH_SEED = 0


class AttentionCache(NamedTuple):
    """What the backward needs from the forward.

    q, k, v : ndarray, shape (B, H, N, d_head)
        The projected inputs, split into heads (k is None for LSH: q is shared).
    heads : ndarray, shape (B, N, d_model) (the compiled path keeps (B N, d_model))
        The heads' outputs concatenated: the input of the output projection.
    gate : ndarray or None
        The variants' pre-activation (``variants.gate_input``); None for the paper's
        attentions.
    saved : tuple or None
        Softmax only: the core's output per head (B, H, N, d_head) and its log-sum-exp
        (B, H, N), which its backward takes instead of recomputing the forward
        (``attend(..., save=True)``); None for the other attentions.
    """

    q: object
    k: object
    v: object
    heads: object
    gate: object = None
    saved: object = None


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


def real_positions(lengths, n):
    """(B, N) bool: True at the first ``lengths[b]`` positions of each sequence b."""
    return np.arange(n) < np.asarray(lengths)[:, None]


def _zero_padded(a, lengths):
    """a (B, H, N, d_head) with the rows of padded positions set to 0 (NaN included)."""
    real = real_positions(lengths, a.shape[-2])[:, None, :, None]        # (B, 1, N, 1)
    return np.where(real, a, a.dtype.type(0))


def attend(q, k, v, cfg, lengths=None, save=False):
    """Attention per head, by ``cfg.attention``: softmax, Eq. (2) (with the mask of Eq. (8)
    if ``cfg.causal``), linear, Eq. (5) (Eq. (9) if ``cfg.causal``), or LSH (q shared with
    the keys, k unused).

    q, k, v (..., N, d_head) -> (..., N, d_head). With ``lengths`` (B,), the real positions
    of each sequence of a padded batch (B, H, N, d_head): sequence b attends over its first
    ``lengths[b]`` keys only, in one call with ``key_lengths`` (one call per sequence for
    LSH, whose bucket count follows the sequence's length), and its padded positions get
    0. Softmax costs O(N^2 d_head), linear O(N d_head^2), LSH O(n_hashes N C d_head) plus
    its hashing (``backend="auto"``: the fastest available backend that takes the call's
    options).

    With ``save``, (out, saved): what ``attend_backward`` can take to skip work, softmax's
    (core output, log-sum-exp) (``softmax_attention``'s ``return_lse``), None otherwise.
    """
    saved = None
    if lengths is not None and cfg.attention == "lsh":
        out = _attend_each(q, v, cfg, lengths)
        return (out, saved) if save else out
    # (B, 1): one length per sequence, shared by its heads
    keys = None if lengths is None else np.asarray(lengths)[:, None]
    if cfg.attention == "softmax" and save:
        out, lse = softmax_attention(q, k, v, causal=cfg.causal, key_lengths=keys,
                                     return_lse=True)
        saved = out, lse
    elif cfg.attention == "softmax":
        out = softmax_attention(q, k, v, causal=cfg.causal, key_lengths=keys)
    elif cfg.attention == "lsh":
        out = lsh_attention(q, v, **_lsh_options(cfg))
    else:
        out = linear_attention(q, k, v, causal=cfg.causal, feature_map=cfg.feature_map,
                               backend="auto", key_lengths=keys)
    out = out if lengths is None else _zero_padded(out, lengths)
    return (out, saved) if save else out


def attend_backward(dout, q, k, v, cfg, lengths=None, saved=None):
    """Backward of ``attend`` (``lengths`` as given to it, ``saved`` as it returned with
    ``save``): (dq, dk, dv), from the core's hand-written backward passes; for LSH dq is dqk
    and dk is None. With ``lengths`` all three are 0 at padded positions: the core zeroes dk
    and dv at padded keys, and the outputs at padded queries were set to 0, so their
    upstream gradient and dq are 0."""
    if lengths is None:
        return _attend_backward(dout, q, k, v, cfg, saved=saved)
    if cfg.attention == "lsh":
        return _attend_each_backward(dout, q, v, cfg, lengths)
    dq, dk, dv = _attend_backward(_zero_padded(dout, lengths), q, k, v, cfg,
                                  np.asarray(lengths)[:, None], saved)
    return _zero_padded(dq, lengths), dk, dv


def _attend_backward(dout, q, k, v, cfg, key_lengths=None, saved=None):
    """The core's backward for ``cfg.attention``: (dq, dk, dv), (dqk, None, dv) for LSH;
    softmax's takes the forward's (out, lse) when ``saved`` holds them."""
    if cfg.attention == "softmax":
        out, lse = saved if saved is not None else (None, None)
        return softmax_attention_backward(dout, q, k, v, causal=cfg.causal,
                                          key_lengths=key_lengths, out=out, lse=lse)
    if cfg.attention == "lsh":
        dqk, dv = lsh_attention_backward(dout, q, v, **_lsh_options(cfg))
        return dqk, None, dv
    return linear_attention_backward(dout, q, k, v, causal=cfg.causal,
                                     feature_map=cfg.feature_map, backend="auto",
                                     key_lengths=key_lengths)


def _attend_each(qk, v, cfg, lengths):
    """LSH attention on a padded batch, sequence b over its own first ``lengths[b]``
    positions in a call of its own, so with the bucket count it gets alone; 0 at padded
    positions."""
    out = np.zeros_like(v)
    for b, n in enumerate(lengths):
        out[b, :, :n] = lsh_attention(qk[b, :, :n], v[b, :, :n], **_lsh_options(cfg))
    return out


def _attend_each_backward(dout, qk, v, cfg, lengths):
    """Backward of ``_attend_each``: (dqk, None, dv), 0 at padded positions."""
    dqk, dv = np.zeros_like(qk), np.zeros_like(v)
    for b, n in enumerate(lengths):
        dqk[b, :, :n], dv[b, :, :n] = lsh_attention_backward(
            dout[b, :, :n], qk[b, :, :n], v[b, :, :n], **_lsh_options(cfg))
    return dqk, None, dv


def attention(p, x, cfg, lengths=None):
    """Multi-head self-attention, causal or not by ``cfg.causal``.

    Parameters
    ----------
    p : dict
        ``wq, wk, wv, wo`` (d_model, d_model) and ``bq, bk, bv, bo`` (d_model,), and the
        variant's own (``variants.init_variant``).
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
    a = saved = None
    if cfg.attention in VARIANTS:          # decay, gate or beta: from x, or a parameter
        _no_padding(cfg, lengths)
        a = variants.gate_input(p, x, cfg)
        heads = merge_heads(variants.attend(q, k, v, a, cfg))
    else:
        out, saved = attend(q, k, v, cfg, lengths, save=True)
        heads = merge_heads(out)                              # (B, N, d_model)
    return linear(heads, p["wo"], p["bo"]), AttentionCache(q, k, v, heads, a, saved)


def _no_padding(cfg, lengths):
    if lengths is not None:
        raise ValueError(f"{cfg.attention} attention is a causal decoder's: it takes no "
                         f"padded batch (lengths)")


def attention_backward(dy, p, x, cache, cfg, lengths=None):
    """Backward of ``attention`` (``lengths`` as given to it).

    Returns
    -------
    dx : ndarray, shape (B, N, d_model)
    grads : dict
        Gradients of ``wq, bq, ..., wo, bo`` (and the variant's parameters), shaped like
        ``p``.
    """
    grads = {}
    dheads, grads["wo"], grads["bo"] = linear_backward(dy, cache.heads, p["wo"], p["bo"])
    dout = split_heads(dheads, cfg.n_heads)                   # (B, H, N, d_head)
    dx = 0
    if cfg.attention in VARIANTS:
        _no_padding(cfg, lengths)
        *dqkv, da = variants.attend_backward(dout, cache.q, cache.k, cache.v, cache.gate, cfg)
        dx, gate_grads = variants.gate_input_backward(da, p, x, cfg)
        grads.update(gate_grads)
    else:
        dqkv = attend_backward(dout, cache.q, cache.k, cache.v, cfg, lengths, cache.saved)
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
