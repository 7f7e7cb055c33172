"""The whole-token compiled call of a linear transformer with elu+1 (``rnn_token.token``)
computes what ``token_loop.token_logits`` computes layer by layer from Python with
``linattn.Recurrence`` memories: the same logits at every token, the same states after the
last, at one sequence and at several, and for a wide model at one sequence (whose products
run row by row on the threads)."""
import inspect

import numpy as np
import pytest

from linattn import Recurrence
from linattn.model.config import ModelConfig
from linattn.model.fast import rnn_token, token_loop
from linattn.model.transformer import init_params

SHAPE = dict(vocab_size=11, max_len=16, d_model=16, n_layers=3, n_heads=4, d_mlp=24,
             positions="learned", attention="linear")


def _params(cfg):
    """A random model whose biases and layer-norm gains are not their init's 0 and 1 (each
    would hide a bias read from the wrong place)."""
    params = init_params(cfg, seed=2)
    rng = np.random.default_rng(3)
    for name, a in params.items():
        if a.ndim == 1:
            params[name] = a + rng.normal(0.0, 0.3, a.shape).astype(a.dtype)
    return params


def _layer_by_layer(cfg, b):
    """The Python loop's memories: one Recurrence per layer, elu+1 applied by its kernel."""
    return tuple(Recurrence((b, cfg.n_heads), cfg.d_head, cfg.d_head,
                            feature_map=cfg.feature_map, dtype=cfg.dtype)
                 for _ in range(cfg.n_layers))


@pytest.mark.parametrize("dtype, rtol", [("float64", 1e-12), ("float32", 2e-5)])
@pytest.mark.parametrize("activation", ["gelu", "relu"])
@pytest.mark.parametrize("b", [1, 3, 16])
def test_one_call_equals_the_layer_loop(dtype, rtol, activation, b):
    cfg = ModelConfig(**SHAPE, dtype=dtype, activation=activation)
    params = _params(cfg)
    ids = np.random.default_rng(b).integers(0, cfg.vocab_size, (b, 12))
    weights = token_loop.prepare(params, cfg, 12)
    assert weights.stacked is not None
    fused_buf, loop_buf = token_loop.buffers(cfg, b, 12), token_loop.buffers(cfg, b, 12)
    fused, loop = token_loop.memories(cfg, b, 12), _layer_by_layer(cfg, b)
    assert isinstance(fused, rnn_token.States)
    for t in range(12):
        got = token_loop.token_logits(weights, fused_buf, fused, cfg, ids[:, t], t).copy()
        want = token_loop.token_logits(weights, loop_buf, loop, cfg, ids[:, t], t)
        assert got.dtype == want.dtype == np.dtype(dtype)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())
    for layer, rnn in enumerate(loop):                  # the states after 12 tokens
        np.testing.assert_allclose(fused.s[layer], rnn.state.S, rtol=rtol, atol=rtol)
        np.testing.assert_allclose(fused.z[layer], rnn.state.z, rtol=rtol, atol=rtol)


def test_a_wide_model_at_one_column():
    """d_mlp x d_model = 2^20 multiply-adds at one column, the rows of W_1 and W_2 split
    over the threads by the fused token's inlined loop as by ``token_kernels.product``."""
    cfg = ModelConfig(**{**SHAPE, "d_model": 512, "d_mlp": 2048, "n_layers": 1,
                         "n_heads": 8}, dtype="float64")
    params = _params(cfg)
    weights, ids = token_loop.prepare(params, cfg, 3), np.array([[1, 5, 2]])
    fused_buf, loop_buf = token_loop.buffers(cfg, 1, 3), token_loop.buffers(cfg, 1, 3)
    fused, loop = token_loop.memories(cfg, 1, 3), _layer_by_layer(cfg, 1)
    for t in range(3):
        got = token_loop.token_logits(weights, fused_buf, fused, cfg, ids[:, t], t).copy()
        want = token_loop.token_logits(weights, loop_buf, loop, cfg, ids[:, t], t)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


def test_a_nan_embedding_poisons_only_its_sequence():
    cfg = ModelConfig(**SHAPE, dtype="float64")
    params = init_params(cfg, seed=2)
    params["tok_emb"][3] = np.nan
    weights, buf = token_loop.prepare(params, cfg, 4), token_loop.buffers(cfg, 2, 4)
    logits = token_loop.token_logits(weights, buf, token_loop.memories(cfg, 2, 4), cfg,
                                     np.array([3, 4]), 0)
    assert np.isnan(logits[0]).all() and np.isfinite(logits[1]).all()


@pytest.mark.parametrize("kw, fused", [({}, True), ({"feature_map": "favor"}, False),
                                       ({"attention": "softmax"}, False)])
def test_which_models_run_as_one_call(kw, fused):
    cfg = ModelConfig(**{**SHAPE, **kw})
    assert rnn_token.fuses(cfg) is fused
    assert (token_loop.prepare(init_params(cfg, seed=0), cfg, 4).stacked is not None) is fused


def test_eps_is_the_library_default():
    assert rnn_token.EPS == inspect.signature(Recurrence).parameters["eps"].default
