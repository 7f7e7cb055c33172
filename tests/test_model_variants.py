"""The attentions beyond the paper in the model (``model.variants``): a learned decay, GLA's
gates and the delta rule. Their layer's and the whole model's gradients against central
finite differences (float64), generation by steps against the parallel forward, the
checkpoint, the command line, and the compiled path's refusal."""
import numpy as np
import pytest

from helpers import assert_gradients_match, numerical_parameter_gradients, relative_error
from linattn.__main__ import main
from linattn.model import paths, prefill, token_step, variants
from linattn.model.attention import attention, attention_backward
from linattn.model.checkpoint import load_checkpoint, save_checkpoint
from linattn.model.config import VARIANTS, ModelConfig, check_config
from linattn.model.fast import lean, token_loop
from linattn.model.generate import generate, step
from linattn.model.layers import cross_entropy, log_sigmoid, sigmoid
from linattn.model.optim import adam_init
from linattn.model.transformer import forward, init_params

TINY = dict(vocab_size=7, max_len=7, d_model=8, n_heads=2, d_mlp=12, dtype="float64")
OWN = {"decay": ("decay_logit",), "gated": ("w_gate", "b_gate"), "delta": ("w_beta", "b_beta")}
# every variant, and the gate with a feature map wider than the head (F = 1 + D + D^2)
CASES = [(v, "elu+1") for v in VARIANTS] + [("gated", "taylor")]


def _layer(variant, feature_map, seed=2):
    cfg = ModelConfig(**TINY, attention=variant, feature_map=feature_map)
    rng = np.random.default_rng(seed)
    p = {k[len("block0."):]: a for k, a in init_params(cfg, seed).items()
         if k.startswith("block0.")}
    for name in ("bq", "bk", "bv", "bo") + OWN[variant][1:]:    # biases away from 0
        p[name] = 0.3 * rng.standard_normal(p[name].shape)
    if variant == "decay":                                    # gammas well inside (0, 1)
        p["decay_logit"] = np.array([0.5, 2.0])
    return cfg, p


@pytest.mark.parametrize("variant, feature_map", CASES)
def test_attention_backward(variant, feature_map):
    # every input of the layer, x and each parameter, the variant's own included
    cfg, p = _layer(variant, feature_map)
    names = ("wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo") + OWN[variant]
    x = np.random.default_rng(1).standard_normal((2, 6, 8))

    def params(w):
        return {**p, **dict(zip(names, w))}

    def f(x, *w):
        return attention(params(w), x, cfg)[0]

    def f_backward(dy, x, *w):
        q = params(w)
        dx, grads = attention_backward(dy, q, x, attention(q, x, cfg)[1], cfg)
        assert grads.keys() == set(names)
        return (dx, *(grads[n] for n in names))

    assert_gradients_match(f, f_backward, [x, *(p[n] for n in names)])


@pytest.mark.parametrize("variant, n_layers", [("decay", 2), ("gated", 1), ("delta", 1)])
def test_model_gradient(variant, n_layers):
    # the whole model by the default path, which routes the variants to the reference
    cfg = ModelConfig(**TINY, attention=variant, n_layers=n_layers)
    params = init_params(cfg, seed=1)
    rng = np.random.default_rng(2)
    ids, targets = rng.integers(0, 7, (2, 5)), rng.integers(0, 7, (2, 5))
    loss, grads = paths.loss_and_grads(params, cfg, ids, targets)
    want = numerical_parameter_gradients(
        params, lambda: cross_entropy(forward(params, cfg, ids)[0], targets))
    assert grads.keys() == params.keys()
    assert all(f"block0.{n}" in grads for n in OWN[variant])
    scale = max(np.max(np.abs(w)) for w in want.values())
    for name in params:
        err = np.max(np.abs(grads[name] - want[name])) / scale
        assert err < 1e-7, f"{name}: error {err:.2e} relative to the largest gradient"
    for name in OWN[variant]:                       # the variant's own, each on its scale
        assert relative_error(grads[f"block0.{name}"], want[f"block0.{name}"]) < 1e-6


def test_log_sigmoid_and_sigmoid_backward():
    from linattn.model.layers import log_sigmoid_backward, sigmoid_backward
    x = np.random.default_rng(3).standard_normal((3, 5)) * 3
    assert_gradients_match(log_sigmoid, log_sigmoid_backward, [x])
    assert_gradients_match(sigmoid, sigmoid_backward, [x])
    big = np.array([-800.0, 0.0, 800.0])                     # no overflow either way
    np.testing.assert_allclose(log_sigmoid(big), [-800.0, -np.log(2), 0.0])
    np.testing.assert_allclose(sigmoid(big), [0.0, 0.5, 1.0])


def test_decay_starts_at_retnet_schedule():
    cfg = ModelConfig(**{**TINY, "d_model": 16, "n_heads": 4}, attention="decay")
    gamma = sigmoid(init_params(cfg)["block0.decay_logit"])
    np.testing.assert_allclose(gamma, 1 - 2.0 ** (-5 - np.arange(4)), rtol=1e-12)


def _model(variant, **kw):
    """A random model with sharper logits than at init (as tests/test_model_generate.py)."""
    cfg = ModelConfig(vocab_size=9, max_len=24, d_model=16, n_layers=2, n_heads=4, d_mlp=32,
                      positions="learned", dtype="float64", attention=variant, **kw)
    params = init_params(cfg, seed=5)
    params["w_out"] = params["w_out"] * 4
    return cfg, params


@pytest.mark.parametrize("variant", VARIANTS)
def test_step_logits_match_the_parallel_form(variant):
    cfg, params = _model(variant)
    ids = np.random.default_rng(6).integers(0, 9, (2, 10))
    want, _ = forward(params, cfg, ids)
    memories = token_step.empty_memories(cfg, 2, 10)
    for t in range(10):
        logits, memories = step(params, cfg, ids[:, t], t, memories)
        np.testing.assert_allclose(logits, want[:, t], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("path", ["lean", "reference"])
def test_greedy_tokens_are_the_parallel_argmax(variant, path):
    # a prompt of 4 read in one pass per layer, then 12 steps: at every generated position
    # the token is the argmax of the parallel forward's logits there
    cfg, params = _model(variant)
    prompt = np.random.default_rng(7).integers(0, 9, (3, 4))
    got = generate(params, cfg, prompt, 12, path=path)
    np.testing.assert_array_equal(got[:, :4], prompt)
    logits, _ = forward(params, cfg, got[:, :-1])
    np.testing.assert_array_equal(got[:, 4:], logits[:, 3:].argmax(axis=-1))
    assert len(np.unique(got[:, 4:])) > 3                    # a real continuation


@pytest.mark.parametrize("variant", VARIANTS)
def test_prompt_read_at_once_gives_the_stepped_memories(variant):
    # one parallel pass per layer (return_state) leaves each layer where 9 steps leave it
    cfg, params = _model(variant)
    ids = np.random.default_rng(8).integers(0, 9, (2, 9))
    read = prefill.read_prompt(params, cfg, ids)
    stepped = token_step.empty_memories(cfg, 2, 9)
    for t in range(9):
        _, stepped = step(params, cfg, ids[:, t], t, stepped)
    for got, want in zip(read, stepped):
        # the delta rule's memory is S alone; the decayed and gated ones are State(S, z)
        pairs = [(got, want)] if variant == "delta" else zip(got, want)
        for a, b in pairs:
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("variant", VARIANTS)
def test_compiled_path_refuses_and_paths_route(variant):
    cfg, params = _model(variant)
    ids = np.zeros((1, 3), dtype=np.int64)
    with pytest.raises(ValueError, match="reference path only"):
        lean.forward(params, cfg, ids)
    with pytest.raises(ValueError, match="reference path only"):
        next(token_loop.next_logits(params, cfg, ids))
    run = paths.resolve("lean", cfg)
    assert run.forward is paths.resolve("reference").forward
    assert run.next_logits is paths.resolve("reference").next_logits


def test_variants_are_causal_only():
    with pytest.raises(ValueError, match="causal only"):
        check_config(ModelConfig(**TINY, attention="delta", causal=False))
    cfg, p = _layer("gated", "elu+1")
    with pytest.raises(ValueError, match="padded batch"):
        attention(p, np.zeros((1, 3, 8)), cfg, lengths=[2])


@pytest.mark.parametrize("variant", VARIANTS)
def test_checkpoint_round_trip(variant, tmp_path):
    cfg, params = _model(variant)
    path = tmp_path / "ckpt.npz"
    save_checkpoint(path, cfg, params, adam_init(params))
    ckpt = load_checkpoint(path, expect=cfg)
    assert ckpt.config == cfg and ckpt.params.keys() == params.keys()
    for name in params:
        np.testing.assert_array_equal(ckpt.params[name], params[name])


def test_gate_width_follows_the_feature_map():
    cfg = ModelConfig(**TINY, attention="gated", feature_map="taylor")
    assert variants.feature_width(cfg) == 1 + 4 + 16
    assert init_params(cfg)["block0.w_gate"].shape == (8, 2 * 21)


@pytest.mark.parametrize("variant", VARIANTS)
def test_command_line_trains_and_generates(variant, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "copy", "--attention", variant, "--length", "3", "--d-model", "8",
                 "--n-layers", "1", "--n-heads", "2", "--d-mlp", "8", "--batch-size", "2",
                 "--steps", "2", "--eval-every", "2", "--out", str(out), "--quiet"]) == 0
    assert "runs on the reference path" in capsys.readouterr().err
    ckpt = load_checkpoint(out / "checkpoint.npz")
    assert ckpt.config.attention == variant
    assert main(["generate", "--checkpoint", str(out / "checkpoint.npz"), "--n", "2",
                 "--temperature", "0", "--out", str(tmp_path / "s.txt")]) == 0
