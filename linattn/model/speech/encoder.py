"""A non-causal transformer encoder over frames of features: the transformer of the speech
experiment, section 4.3 of Katharopoulos et al. (2020), arXiv:2006.16236, which reads a
whole utterance and scores every frame for CTC.

    x_0 = frames W_in + b_in + positions        (sinusoidal, as in ``transformer``)
    x_l = block_l(x_{l-1})                       the decoder's pre-norm blocks (Eq. 1), with
                                                 attention over every frame: ``causal=False``
                                                 softmax Eq. (2) or linear Eq. (5)
    logits = LN(x_L) W_out + b_out               (B, T, C)

The attention goes through ``attention.attend`` with the config's ``attention`` and
``causal=False``, so every attention that function knows serves here too. Padded frames:
the whole padded batch attends in one core call per layer (LSH: one per utterance), each
utterance over its own frames only (``attention.attend`` with ``lengths``: the core's
``key_lengths``), and every other layer works frame by frame, so padding reaches no real
frame and a padded batch gives each utterance the logits and gradients it would get alone.
The blocks run on the path ``path`` names (``model.paths``): "lean", the compiled blocks of
``fast.lean``, or "reference", ``transformer.block``.
Reference: tests/test_model_speech.py holds the backward to central finite differences,
the lean path to the reference, and the padded batch to each utterance alone.
"""
from typing import NamedTuple

import numpy as np

from .. import paths
from ..config import check_config
from ..layers import layer_norm, layer_norm_backward, linear, linear_backward
from ..transformer import block_params, init_blocks_and_head, sinusoidal_positions


class EncoderCache(NamedTuple):
    """Each block's cache, the last residual stream x_out and its normalised form h_out."""

    blocks: tuple
    x_out: object
    h_out: object


def init_params(cfg, n_inputs, seed=0):
    """Random parameters of the encoder ``cfg`` (a ModelConfig with ``causal=False``;
    ``cfg.vocab_size`` is the number of output classes C) on ``n_inputs`` features per
    frame; the blocks as in ``transformer.init_params``, w_in normal with std 1/sqrt(F).

    Returns
    -------
    params : dict of str -> ndarray, in ``cfg.dtype``: ``w_in, b_in``, ``block{l}.*``,
        ``lnf_g, lnf_b, w_out, b_out``.
    """
    check_config(cfg)
    if cfg.causal:
        raise ValueError("the encoder reads whole utterances: its config needs causal=False")
    rng = np.random.default_rng(seed)
    d, c = cfg.d_model, cfg.vocab_size

    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(cfg.dtype)

    params = {"w_in": normal((n_inputs, d), n_inputs**-0.5), "b_in": np.zeros(d, cfg.dtype)}
    return {**params, **init_blocks_and_head(normal, cfg, c)}


def forward(params, cfg, features, lengths, path="lean"):
    """Per-frame class scores.

    Parameters
    ----------
    params : dict from ``init_params``
    cfg : ModelConfig, causal=False
    features : ndarray, shape (B, T, F)
    lengths : ndarray of int, shape (B,)
        Real frames per utterance; later frames are padding.
    path : {"lean", "reference"}
        Which blocks compute it (``model.paths``); the same logits up to rounding.

    Returns
    -------
    logits : ndarray, shape (B, T, C); at padded frames they are computed but meaningless.
    cache : EncoderCache

    Cost: O(L B T d_model (d_model + d_mlp)) plus the attention over the padded batch:
    O(L B T^2 d_model) for softmax, O(L B T d_model d_head) for linear.
    """
    block = paths.resolve(path).block
    x = linear(features, params["w_in"], params["b_in"])
    x = x + sinusoidal_positions(0, features.shape[1], cfg.d_model, x.dtype)
    caches = []
    for layer in range(cfg.n_layers):
        x, c = block(block_params(params, layer), x, cfg, lengths)
        caches.append(c)
    h = layer_norm(x, params["lnf_g"], params["lnf_b"])
    logits = linear(h, params["w_out"], params["b_out"])
    return logits, EncoderCache(tuple(caches), x, h)


def backward(dlogits, params, cfg, features, lengths, cache, path="lean"):
    """Backward of ``forward`` (``path`` as given to it): (dfeatures, grads), dfeatures
    (B, T, F) and grads a dict shaped like params. Cost: about twice the forward's."""
    block_backward = paths.resolve(path).block_backward
    grads = {}
    dh, grads["w_out"], grads["b_out"] = linear_backward(dlogits, cache.h_out,
                                                         params["w_out"], params["b_out"])
    dx, grads["lnf_g"], grads["lnf_b"] = layer_norm_backward(
        dh, cache.x_out, params["lnf_g"], params["lnf_b"])
    for layer in reversed(range(cfg.n_layers)):
        dx, g = block_backward(dx, block_params(params, layer), cache.blocks[layer], cfg,
                               lengths)
        grads.update({f"block{layer}.{name}": a for name, a in g.items()})
    # x_0 = features W_in + b_in + positions: the positions are fixed
    dfeatures, grads["w_in"], grads["b_in"] = linear_backward(dx, features, params["w_in"],
                                                              params["b_in"])
    return dfeatures, grads
