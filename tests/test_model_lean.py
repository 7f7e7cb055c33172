"""The lean training path (``fast.lean.forward``, ``backward``, ``block``) against the
reference path of NumPy layers: the same logits and the same whole-model
gradient in float64, for every attention, activation and position encoding; and once
against central finite differences."""
import numpy as np
import pytest

from helpers import numerical_parameter_gradients, relative_error
from linattn.model.fast import lean
from linattn.model.config import ModelConfig
from linattn.model.layers import cross_entropy
from linattn.model.paths import loss_and_grads
from linattn.model.transformer import block, block_params, forward, init_params

TINY = dict(vocab_size=7, max_len=9, d_model=8, n_heads=2, d_mlp=12, dtype="float64")
VARIANTS = [dict(attention="linear", n_layers=2),
            dict(attention="linear", n_layers=2, positions="learned", n_heads=1),
            dict(attention="softmax", n_layers=2, activation="relu"),
            dict(attention="linear", n_layers=1, feature_map="taylor"),
            dict(attention="lsh", n_layers=2, n_hashes=2, lsh_chunk_size=2)]


def _batch(seed, b=3, n=9, vocab=7):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, vocab, (b, n)), rng.integers(0, vocab, (b, n)),
            (rng.random((b, n)) > 0.3).astype(float))


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v.values())))
def test_lean_gradient_is_the_reference(variant):
    cfg = ModelConfig(**{**TINY, **variant})
    params = init_params(cfg, seed=1)
    ids, targets, weights = _batch(2)
    loss, grads = loss_and_grads(params, cfg, ids, targets, weights)          # lean
    want_loss, want = loss_and_grads(params, cfg, ids, targets, weights, path="reference")
    np.testing.assert_allclose(loss, want_loss, rtol=1e-13)
    assert grads.keys() == want.keys() == params.keys()
    scale = max(np.max(np.abs(w)) for w in want.values())
    for name in params:
        assert grads[name].shape == params[name].shape and grads[name].dtype == np.float64
        np.testing.assert_allclose(grads[name], want[name], rtol=1e-10, atol=1e-13 * scale,
                                   err_msg=name)


@pytest.mark.parametrize("variant", VARIANTS[:3], ids=lambda v: "-".join(map(str, v.values())))
def test_lean_logits_and_block_are_the_reference(variant):
    cfg = ModelConfig(**{**TINY, **variant})
    params = init_params(cfg, seed=3)
    ids, _, _ = _batch(4)
    np.testing.assert_allclose(lean.forward(params, cfg, ids)[0], forward(params, cfg, ids)[0],
                               rtol=1e-12, atol=1e-14)
    x = np.random.default_rng(5).standard_normal((3, 9, 8))
    p = block_params(params, 0)
    np.testing.assert_allclose(lean.block(p, x, cfg)[0], block(p, x, cfg)[0], rtol=1e-12,
                               atol=1e-14)


def test_lean_gradient_matches_finite_differences():
    cfg = ModelConfig(**TINY, attention="linear", n_layers=1, positions="learned")
    params = init_params(cfg, seed=6)
    ids, targets, weights = _batch(7, b=2, n=5)
    _, grads = loss_and_grads(params, cfg, ids, targets, weights)
    want = numerical_parameter_gradients(
        params, lambda: cross_entropy(lean.forward(params, cfg, ids)[0], targets, weights))
    assert relative_error(np.concatenate([grads[n].ravel() for n in params]),
                          np.concatenate([want[n].ravel() for n in params])) < 1e-7


def test_lean_float32_stays_float32_and_close_to_the_reference():
    cfg = ModelConfig(**{**TINY, "dtype": "float32"}, attention="linear", n_layers=2)
    params = init_params(cfg, seed=8)
    ids, targets, weights = _batch(9)
    loss, grads = loss_and_grads(params, cfg, ids, targets, weights)
    want_loss, want = loss_and_grads(params, cfg, ids, targets, weights, path="reference")
    assert {g.dtype for g in grads.values()} == {np.dtype(np.float32)}
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    scale = max(np.max(np.abs(w)) for w in want.values())
    for name in params:
        np.testing.assert_allclose(grads[name], want[name], rtol=1e-3, atol=1e-5 * scale,
                                   err_msg=name)


def test_unknown_path_is_an_error():
    cfg = ModelConfig(**TINY)
    ids, targets, weights = _batch(10)
    with pytest.raises(ValueError, match="path must be one of lean, reference"):
        loss_and_grads(init_params(cfg), cfg, ids, targets, weights, path="fast")
