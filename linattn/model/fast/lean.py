"""The transformer of the compiled (lean) training path: the same functions as
``transformer.block``, ``forward`` and ``backward`` (Eq. (1) of Katharopoulos et al. (2020),
arXiv:2006.16236, pre-norm), computed with fewer passes over memory.

    h1 = LN(x)                                  ``fused.layer_norm``, xhat and rstd kept
    a  = A(h1) without b_O                      ``fast.attention.attention_fused``: QKV one product
    x' = x + a + b_O,  h2 = LN(x')              ``fused.add_layer_norm``: one pass
    u  = h2 W1 + b1,   g = act(u)               ``fused.bias_gelu``: u and g kept
    y  = x' + g W2 + b2

What the backward needs is kept from the forward instead of recomputed: the layer norms'
xhat and 1 / std, the MLP's pre-activation u and activation g (the reference recomputes
act(u) and both normalisations) and keeps x and x' instead: B N (d_mlp + 2) floats more per
block, memory traded for passes (docs/performance.md).
Reference: ``transformer.block``, ``block_backward``, ``forward`` and ``backward``
(tests/test_model_lean.py holds the whole model's gradient on this path to the reference's,
in float64).
"""
from typing import NamedTuple

from . import fused
from .attention import attention_fused, attention_fused_backward
from ..layers import ACTIVATIONS, linear, linear_backward
from ..transformer import block_params, check_ids, embed, embed_backward


class LeanBlockCache(NamedTuple):
    """One block's kept intermediates: LN(x) h1 and its saved (xhat, rstd) ln1, the
    attention's cache, LN(x') h2 and ln2, the MLP's pre-activation u and activation g."""

    h1: object
    ln1: object
    attn: object
    h2: object
    ln2: object
    u: object
    g: object


def _rows(x):
    return x.reshape(-1, x.shape[-1])


def block(p, x, cfg, lengths=None):
    """One pre-norm block, x (B, N, d_model) -> (y, LeanBlockCache): ``transformer.block``.
    ``lengths``: real positions per sequence of a padded batch (see ``attention.attend``).
    Cost: as the reference's, in fewer passes."""
    h1, ln1 = fused.layer_norm(x, p["ln1_g"], p["ln1_b"])
    a, attn = attention_fused(p, h1, cfg, lengths)
    x_mid, h2, ln2 = fused.add_layer_norm(x, a, p["bo"], p["ln2_g"], p["ln2_b"])
    u = _rows(h2) @ p["w1"]                                   # (B N, d_mlp)
    if cfg.activation == "gelu":
        g = fused.bias_gelu(u, p["b1"])                       # u += b1, g = gelu(u)
    else:
        u += p["b1"]
        g = ACTIVATIONS[cfg.activation][0](u)
    y = g @ p["w2"]                                           # (B N, d_model)
    y += p["b2"]
    y += _rows(x_mid)                                         # the residual
    return y.reshape(x.shape), LeanBlockCache(h1, ln1, attn, h2, ln2, u, g)


def block_backward(dy, p, cache, cfg, lengths=None):
    """Backward of ``block`` (``lengths`` as given to it): (dx, grads of the block's
    parameters by short name)."""
    grads = {}
    dy2 = _rows(dy)
    # MLP branch: y = x' + g W2 + b2, g = act(u), u = h2 W1 + b1
    grads["w2"], grads["b2"] = cache.g.T @ dy2, dy2.sum(axis=0)
    dg = dy2 @ p["w2"].T                                      # (B N, d_mlp)
    if cfg.activation == "gelu":
        (du,) = fused.gelu_backward(dg, cache.u, overwrite=True)
    else:
        (du,) = ACTIVATIONS[cfg.activation][1](dg, cache.u)
    grads["w1"], grads["b1"] = _rows(cache.h2).T @ du, du.sum(axis=0)
    dh2 = (du @ p["w1"].T).reshape(dy.shape)
    # x' reaches y by the residual and by LN(x'): their gradients add
    dx_mid, grads["ln2_g"], grads["ln2_b"] = fused.layer_norm_backward(
        dh2, cache.ln2, p["ln2_g"], residual=dy)
    # attention branch: x' = x + A(h1) + b_O, h1 = LN(x)
    dh1, attn_grads = attention_fused_backward(dx_mid, p, cache.h1, cache.attn, cfg,
                                                 lengths)
    grads.update(attn_grads)
    dx, grads["ln1_g"], grads["ln1_b"] = fused.layer_norm_backward(
        dh1, cache.ln1, p["ln1_g"], residual=dx_mid)
    return dx, grads


class LeanCache(NamedTuple):
    """``forward``'s intermediates: token ids, each block's ``LeanBlockCache``, the final
    layer norm's saved (xhat, rstd) and its output h_out."""

    ids: object
    blocks: tuple
    lnf: object
    h_out: object


def forward(params, cfg, ids):
    """``transformer.forward`` by the compiled path: the blocks above and the compiled layer
    norm, keeping what ``backward`` needs. Same arguments and logits (up to rounding), a
    ``LeanCache``. Cost: as the reference's."""
    ids = check_ids(cfg, ids)
    x = embed(params, cfg, ids)
    caches = []
    for layer in range(cfg.n_layers):
        x, c = block(block_params(params, layer), x, cfg)
        caches.append(c)
    h, lnf = fused.layer_norm(x, params["lnf_g"], params["lnf_b"])
    logits = linear(h, params["w_out"], params["b_out"])
    return logits, LeanCache(ids, tuple(caches), lnf, h)


def backward(dlogits, params, cfg, cache):
    """Backward of ``forward``: every parameter's gradient, as ``transformer.backward``'s."""
    grads = {}
    dh, grads["w_out"], grads["b_out"] = linear_backward(dlogits, cache.h_out,
                                                         params["w_out"], params["b_out"])
    dx, grads["lnf_g"], grads["lnf_b"] = fused.layer_norm_backward(dh, cache.lnf,
                                                                   params["lnf_g"])
    for layer in reversed(range(cfg.n_layers)):
        dx, g = block_backward(dx, block_params(params, layer), cache.blocks[layer], cfg)
        grads.update({f"block{layer}.{name}": a for name, a in g.items()})
    grads.update(embed_backward(dx, params, cfg, cache.ids, fused.embedding_backward))
    return grads
