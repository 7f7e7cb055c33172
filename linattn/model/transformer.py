"""A decoder-only transformer, forward and hand-written backward, in plain NumPy.

Eq. (1) of Katharopoulos et al. (2020), arXiv:2006.16236, in its pre-norm form:
    x_0 = embed(tokens) + positions
    x'  = x_{l-1} + A_l(LN(x_{l-1}))          A_l: causal multi-head attention (Eq. 2 / 9)
    x_l = x' + f_l(LN(x'))                    f_l: two-layer MLP
    logits = LN(x_L) W_out + b_out,           loss: softmax cross-entropy.

Parameters live in one flat dict of arrays (``tok_emb``, ``block0.wq``, ..., ``w_out``):
the optimiser and checkpoints treat them uniformly. ``forward`` returns the logits and a
``ForwardCache`` of per-layer intermediates, which ``backward`` consumes.
Reference: the whole-model gradient is held to central finite differences in
tests/test_model_transformer.py.

This is the reference model. Training runs the compiled path by default
(``model.fast.lean``: the same forward and backward with compiled element layers and kept
activations, held to these by tests/test_model_lean.py); ``model.paths`` chooses.
"""
from typing import NamedTuple

import numpy as np

from .attention import PROJECTIONS, attention, attention_backward
from .config import VARIANTS, check_config
from .layers import (ACTIVATIONS, embedding, embedding_backward, layer_norm,
                     layer_norm_backward, linear, linear_backward)
from .variants import init_variant


class BlockCache(NamedTuple):
    """One block's intermediates: its input x, LN(x) h1, the attention's cache, the
    residual stream after attention x_mid, LN(x_mid) h2, and the MLP's pre-activation u."""

    x: object
    h1: object
    attn: object
    x_mid: object
    h2: object
    u: object


class ForwardCache(NamedTuple):
    """The whole forward's intermediates: token ids, each block's cache, the last residual
    stream x_out and its normalised form h_out."""

    ids: object
    blocks: tuple
    x_out: object
    h_out: object


def block_params(params, layer):
    """The parameters of block ``layer`` under their short names (``wq``, ``ln1_g``, ...)."""
    prefix = f"block{layer}."
    return {name[len(prefix):]: a for name, a in params.items() if name.startswith(prefix)}


def init_params(cfg, seed=0):
    """Random parameters for ``cfg``, deterministic in ``seed``.

    Weights are normal with standard deviation 1/sqrt(fan_in); the projections that write
    into the residual stream (``wo``, ``w2``) are further scaled by 1/sqrt(2 n_layers) so
    the stream's variance stays O(1) with depth. Biases start at 0, gains at 1.

    Returns
    -------
    params : dict of str -> ndarray, in ``cfg.dtype``.
    """
    check_config(cfg)
    rng = np.random.default_rng(seed)
    d, v = cfg.d_model, cfg.vocab_size

    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(cfg.dtype)

    params = {"tok_emb": normal((v, d), 1.0)}
    if cfg.positions == "learned":
        params["pos_emb"] = normal((cfg.max_len, d), 1.0)
    return {**params, **init_blocks_and_head(normal, cfg, v)}


def init_blocks_and_head(normal, cfg, n_out):
    """Every block's parameters (``block{l}.*``, from ``init_block``), the final layer norm
    (``lnf_g``, ``lnf_b``) and the output projection to ``n_out`` classes (``w_out``
    (d_model, n_out) with std 1/sqrt(d_model), ``b_out``): what the decoder of
    ``init_params`` and the speech encoder share."""
    d, params = cfg.d_model, {}
    for layer in range(cfg.n_layers):
        p = init_block(normal, cfg)
        params.update({f"block{layer}.{name}": a.astype(cfg.dtype) for name, a in p.items()})
    params.update({"lnf_g": np.ones(d, cfg.dtype), "lnf_b": np.zeros(d, cfg.dtype),
                   "w_out": normal((d, n_out), d**-0.5), "b_out": np.zeros(n_out, cfg.dtype)})
    return params


def init_block(normal, cfg):
    """One block's parameters by short name, drawing weights from ``normal(shape, std)``;
    the scheme of ``init_params``, and the variant's own beyond the paper
    (``variants.init_variant``: ``decay_logit``, ``w_gate``, ``b_gate``, ``w_beta`` or
    ``b_beta``)."""
    d, f = cfg.d_model, cfg.d_mlp
    residual = (2 * cfg.n_layers) ** -0.5
    p = {"ln1_g": np.ones(d), "ln1_b": np.zeros(d),
         "ln2_g": np.ones(d), "ln2_b": np.zeros(d),
         "w1": normal((d, f), d**-0.5), "b1": np.zeros(f),
         "w2": normal((f, d), f**-0.5 * residual), "b2": np.zeros(d)}
    for name in PROJECTIONS:
        p["w" + name] = normal((d, d), d**-0.5 * (residual if name == "o" else 1))
        p["b" + name] = np.zeros(d)
    if cfg.attention in VARIANTS:
        p.update(init_variant(normal, cfg))
    return p


def sinusoidal_positions(start, n, d, dtype):
    """Fixed position encodings for positions start..start+n-1, shape (n, d):
    pe[t, 2i] = sin(t / 10000^(2i/d)), pe[t, 2i+1] = cos(t / 10000^(2i/d))."""
    t = np.arange(start, start + n)[:, None]
    angle = t / 10000.0 ** (np.arange(0, d, 2) / d)         # (n, d/2)
    pe = np.empty((n, d))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angle), np.cos(angle)
    return pe.astype(dtype)


def embed(params, cfg, ids, start=0):
    """Token embeddings plus position encodings for positions start..start+N-1.
    ids (B, N) -> x (B, N, d_model)."""
    x = embedding(ids, params["tok_emb"])
    n = ids.shape[-1]
    if cfg.positions == "learned":
        return x + params["pos_emb"][start:start + n]
    return x + sinusoidal_positions(start, n, cfg.d_model, x.dtype)


def mlp(p, h, cfg):
    """f(h) = act(h W1 + b1) W2 + b2; returns (y, u) with u the pre-activation."""
    act, _ = ACTIVATIONS[cfg.activation]
    u = linear(h, p["w1"], p["b1"])                           # (B, N, d_mlp)
    return linear(act(u), p["w2"], p["b2"]), u


def block(p, x, cfg, lengths=None):
    """One pre-norm block, x -> x + A(LN(x)) -> x' + f(LN(x')). Returns (y, BlockCache).
    ``lengths``: real positions per sequence of a padded batch (see ``attention``)."""
    h1 = layer_norm(x, p["ln1_g"], p["ln1_b"])
    a, attn = attention(p, h1, cfg, lengths)
    x_mid = x + a
    h2 = layer_norm(x_mid, p["ln2_g"], p["ln2_b"])
    m, u = mlp(p, h2, cfg)
    return x_mid + m, BlockCache(x, h1, attn, x_mid, h2, u)


def block_backward(dy, p, cache, cfg, lengths=None):
    """Backward of ``block``: (dx, grads of the block's parameters by short name)."""
    act, act_backward = ACTIVATIONS[cfg.activation]
    g = {}
    # MLP branch: y = x_mid + act(u) W2 + b2, u = h2 W1 + b1
    dact, g["w2"], g["b2"] = linear_backward(dy, act(cache.u), p["w2"], p["b2"])
    (du,) = act_backward(dact, cache.u)
    dh2, g["w1"], g["b1"] = linear_backward(du, cache.h2, p["w1"], p["b1"])
    dln2, g["ln2_g"], g["ln2_b"] = layer_norm_backward(dh2, cache.x_mid, p["ln2_g"], p["ln2_b"])
    dx_mid = dy + dln2                                        # residual + normalised path
    # attention branch: x_mid = x + A(h1), h1 = LN(x)
    dh1, attn_grads = attention_backward(dx_mid, p, cache.h1, cache.attn, cfg, lengths)
    g.update(attn_grads)
    dln1, g["ln1_g"], g["ln1_b"] = layer_norm_backward(dh1, cache.x, p["ln1_g"], p["ln1_b"])
    return dx_mid + dln1, g


def forward(params, cfg, ids):
    """Logits for every position of ``ids``.

    Parameters
    ----------
    params : dict from ``init_params``
    cfg : ModelConfig
    ids : ndarray of int, shape (B, N), N <= cfg.max_len

    Returns
    -------
    logits : ndarray, shape (B, N, vocab_size)
    cache : ForwardCache

    Cost: O(L B N d_model (d_model + d_mlp)) plus the attention: O(L B N^2 d_model) for
    softmax, O(L B N d_model d_head) for linear, O(L B N n_hashes C d_model) plus the
    hashing for lsh.
    """
    ids = check_ids(cfg, ids)
    x = embed(params, cfg, ids)
    caches = []
    for layer in range(cfg.n_layers):
        x, c = block(block_params(params, layer), x, cfg)
        caches.append(c)
    h = layer_norm(x, params["lnf_g"], params["lnf_b"])
    logits = linear(h, params["w_out"], params["b_out"])
    return logits, ForwardCache(ids, tuple(caches), x, h)


def check_ids(cfg, ids):
    """``ids`` as an integer array (B, N), N <= cfg.max_len, every id in [0, vocab_size);
    else a ValueError naming what is wrong."""
    ids = np.asarray(ids)
    if ids.ndim != 2 or ids.dtype.kind not in "iu":
        raise ValueError(f"ids must be an integer array of shape (B, N), got {ids.dtype} "
                         f"{ids.shape}")
    if ids.shape[1] > cfg.max_len:
        raise ValueError(f"sequence length {ids.shape[1]} exceeds max_len {cfg.max_len}")
    if ids.size and (ids.min() < 0 or ids.max() >= cfg.vocab_size):
        raise ValueError(f"token ids must lie in [0, {cfg.vocab_size}), got "
                         f"[{ids.min()}, {ids.max()}]")
    return ids


def backward(dlogits, params, cfg, cache):
    """Backward of ``forward``: the gradient of every parameter, a dict shaped like params.

    Cost: about twice the forward's.
    """
    grads = {}
    dh, grads["w_out"], grads["b_out"] = linear_backward(dlogits, cache.h_out,
                                                         params["w_out"], params["b_out"])
    dx, grads["lnf_g"], grads["lnf_b"] = layer_norm_backward(
        dh, cache.x_out, params["lnf_g"], params["lnf_b"])
    for layer in reversed(range(cfg.n_layers)):
        dx, g = block_backward(dx, block_params(params, layer), cache.blocks[layer], cfg)
        grads.update({f"block{layer}.{name}": a for name, a in g.items()})
    grads.update(embed_backward(dx, params, cfg, cache.ids, embedding_backward))
    return grads


def embed_backward(dx, params, cfg, ids, table_backward):
    """Gradients of ``embed``'s tables from dx (B, N, d_model): ``tok_emb`` by
    ``table_backward`` (``layers.embedding_backward``, or the compiled path's), and
    ``pos_emb`` if the positions are learned."""
    (grads,) = table_backward(dx, ids, params["tok_emb"])
    grads = {"tok_emb": grads}
    if cfg.positions == "learned":
        grads["pos_emb"] = np.zeros_like(params["pos_emb"])
        grads["pos_emb"][:ids.shape[1]] = dx.sum(axis=0)  # every sequence uses rows 0..N-1
    return grads
