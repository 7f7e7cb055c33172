"""The attention layer of the compiled training path: ``attention.attention`` with Q, K and
V from one matrix product.

Q = x W_Q, K = x W_K, V = x W_V (Eq. 2 of Katharopoulos et al. (2020), arXiv:2006.16236) as
x [W_Q W_K W_V], one product with the three weights side by side; their biases added and the
heads split in one compiled pass (``fused.heads_from_projections``, and
``fused.projections_from_heads`` back); each head attends by the reference's ``attend``
(a padded batch in one call, with ``lengths``); and b_O is left to the caller's residual
add (``fused.add_layer_norm``). LSH shares queries and keys, so its one product has two
parts, [W_Q W_V].
The attentions beyond the paper (``config.VARIANTS``) are not here: ``check_compiled``
refuses them (``model.paths`` sends them to the reference).
Reference: ``attention.attention`` and ``attention_backward`` (tests/test_model_lean.py
holds the whole model on this path to the reference's).
"""
import numpy as np

from . import fused
from ..attention import AttentionCache, attend, attend_backward, split_heads
from ..config import VARIANTS


def check_compiled(cfg):
    """``cfg`` if the compiled path computes its attention; a ValueError for the variants
    beyond the paper, which run on the reference path only."""
    if cfg.attention in VARIANTS:
        raise ValueError(f"{cfg.attention} attention runs on the reference path only: the "
                         f"compiled path has none of {', '.join(VARIANTS)}; pass "
                         f"path='reference' (model.paths.resolve(path, cfg) does)")
    return cfg


def _projected(cfg):
    """The projections of x the attention reads: q, k and v, or q and v for LSH."""
    return "qv" if cfg.attention == "lsh" else "qkv"


def _stacked(p, names, prefix):
    """[W_q W_k W_v] (d_model, P d_model) or [b_q b_k b_v] (P d_model,): one product's
    operand for the P projections ``names``."""
    return np.concatenate([p[prefix + name] for name in names], axis=-1)


def attention_fused(p, x, cfg, lengths=None):
    """``attention.attention`` as the compiled path computes it: Q, K, V from one matrix
    product x [W_Q W_K W_V] + [b_Q b_K b_V], and heads W_O without b_O, which the caller
    adds with the residual (``fused.add_layer_norm``).

    Parameters
    ----------
    p : dict, as for ``attention.attention``
    x : ndarray, shape (B, N, d_model)
    cfg : ModelConfig
    lengths : sequence of int, optional
        Real positions per sequence of a padded batch (see ``attention.attend``); None: all
        N are real.

    Returns
    -------
    a : ndarray, shape (B, N, d_model), heads W_O
    cache : AttentionCache, its heads (B N, d_model); for softmax, ``saved`` holds the
        core's output and log-sum-exp, which the backward reads instead of a second
        forward

    Cost: as ``attention.attention``'s.
    """
    names = _projected(check_compiled(cfg))
    b, n, d = x.shape
    proj = x.reshape(-1, d) @ _stacked(p, names, "w")                # (B N, P d_model)
    # the bias added and all heads of all projections split in one pass, (P, B, H, N,
    # d_head): the kernels take each (batch, head) row contiguous, and the backward reads
    # them again
    parts = fused.heads_from_projections(proj, _stacked(p, names, "b"), n, len(names),
                                         cfg.n_heads)
    heads_in = dict(zip(names, parts))
    q, k, v = heads_in["q"], heads_in.get("k"), heads_in["v"]
    out, saved = attend(q, k, v, cfg, lengths, save=True)
    heads = fused.projections_from_heads(out)                          # (B N, d_model)
    return (heads @ p["wo"]).reshape(b, n, d), AttentionCache(q, k, v, heads, saved=saved)


def attention_fused_backward(dy, p, x, cache, cfg, lengths=None):
    """Backward of ``attention_fused`` (``lengths`` as given to it): (dx, grads of ``wq, bq,
    ..., wo, bo``), b_O's gradient included (the sum of dy over positions).

    With dP the gradient of the one product's output: dx = dP [W_Q W_K W_V]^T and
    [dW_Q dW_K dW_V] = x^T dP, one product each.
    """
    names = _projected(check_compiled(cfg))
    b, n, d = x.shape
    dy2 = dy.reshape(-1, d)
    grads = {"wo": cache.heads.reshape(-1, d).T @ dy2, "bo": dy2.sum(axis=0)}
    dout = split_heads((dy2 @ p["wo"].T).reshape(b, n, d), cfg.n_heads)
    dq, dk, dv = attend_backward(dout, cache.q, cache.k, cache.v, cfg, lengths, cache.saved)
    dproj = fused.projections_from_heads(*(dh for dh in (dq, dk, dv) if dh is not None))
    # dproj: (B N, P d_model), the gradient of the one product's output
    dx = (dproj @ _stacked(p, names, "w").T).reshape(x.shape)
    dw, dbias = x.reshape(-1, d).T @ dproj, dproj.sum(axis=0)
    for i, name in enumerate(names):
        grads["w" + name] = np.ascontiguousarray(dw[:, i * d:(i + 1) * d])
        grads["b" + name] = dbias[i * d:(i + 1) * d].copy()
    if cfg.attention == "lsh":                                      # W_K unused
        grads["wk"], grads["bk"] = np.zeros_like(p["wk"]), np.zeros_like(p["bk"])
    return dx, grads
