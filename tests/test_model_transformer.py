"""The whole model: its gradient against central finite differences on tiny configurations
(float64), and its forward's basic properties."""
import numpy as np
import pytest

from helpers import numerical_parameter_gradients, relative_error
from linattn.model.config import ModelConfig, check_config
from linattn.model.layers import cross_entropy
from linattn.model.paths import loss_and_grads
from linattn.model.transformer import forward, init_params

TINY = dict(vocab_size=7, max_len=6, d_model=8, n_heads=2, d_mlp=12, dtype="float64")
VARIANTS = [dict(attention="linear", n_layers=2),
            dict(attention="softmax", n_layers=2, positions="learned", activation="relu"),
            dict(attention="linear", n_layers=1, feature_map="taylor", positions="learned"),
            dict(attention="lsh", n_layers=2, n_hashes=2, lsh_chunk_size=2)]
SLOW = (0, 3)          # whole-model finite differences through two layers: tens of seconds


def _batch(seed, b=2, n=5, vocab=7):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, vocab, (b, n)), rng.integers(0, vocab, (b, n)),
            (rng.random((b, n)) > 0.3).astype(float))




@pytest.mark.parametrize("variant", [
    pytest.param(v, marks=pytest.mark.slow) if i in SLOW else v for i, v in enumerate(VARIANTS)],
    ids=lambda v: "-".join(map(str, v.values())))
def test_model_gradient(variant):
    cfg = ModelConfig(**TINY, **variant)
    params = init_params(cfg, seed=1)
    ids, targets, weights = _batch(2)
    loss, grads = loss_and_grads(params, cfg, ids, targets, weights)
    want = numerical_parameter_gradients(params, lambda: cross_entropy(forward(params, cfg, ids)[0], targets,
                                                    weights))
    assert grads.keys() == params.keys()
    # one scale for all parameters: some true gradients are exactly 0 (softmax's key bias,
    # embedding rows of unused ids), where a per-array relative error would be meaningless
    scale = max(np.max(np.abs(w)) for w in want.values())
    for name in params:
        assert grads[name].shape == params[name].shape
        err = np.max(np.abs(grads[name] - want[name])) / scale
        assert err < 1e-7, f"{name}: error {err:.2e} relative to the largest gradient"
    assert relative_error(np.concatenate([grads[n].ravel() for n in params]),
                          np.concatenate([want[n].ravel() for n in params])) < 1e-7


def test_forward_shapes_and_causality():
    cfg = ModelConfig(**TINY, attention="linear", n_layers=2)
    params = init_params(cfg)
    ids = np.array([[1, 2, 3, 4], [4, 3, 2, 1]])
    logits, cache = forward(params, cfg, ids)
    assert logits.shape == (2, 4, 7) and len(cache.blocks) == 2
    ids2 = ids.copy()
    ids2[:, -1] = 0
    np.testing.assert_allclose(forward(params, cfg, ids2)[0][:, :-1], logits[:, :-1],
                               rtol=1e-12)


def test_init_is_deterministic_and_typed():
    cfg = ModelConfig(vocab_size=5, max_len=4, d_model=8, n_heads=2)
    a, b, c = init_params(cfg, 3), init_params(cfg, 3), init_params(cfg, 4)
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert not np.array_equal(a["tok_emb"], c["tok_emb"])
    assert {x.dtype for x in a.values()} == {np.dtype(np.float32)}


@pytest.mark.parametrize("ids, match", [
    (np.zeros((2, 7), dtype=int), "max_len"),
    (np.full((1, 3), 7), r"\[0, 7\)"),
    (np.zeros(3, dtype=int), "shape"),
    (np.zeros((1, 3)), "integer"),
])
def test_forward_rejects_bad_ids(ids, match):
    cfg = ModelConfig(**TINY)
    with pytest.raises(ValueError, match=match):
        forward(init_params(cfg), cfg, ids)


@pytest.mark.parametrize("field, value, match", [
    ("n_heads", 3, "divisible"), ("attention", "reformer", "attention"),
    ("feature_map", "cosine", "feature_map"), ("d_model", 0, "positive"),
    ("dtype", "float16", "dtype"), ("positions", "rotary", "positions"),
    ("n_hashes", 0, "positive"), ("lsh_chunk_size", 1.5, "positive"),
])
def test_config_rejects_bad_fields(field, value, match):
    with pytest.raises(ValueError, match=match):
        check_config(ModelConfig(**{**TINY, field: value}))


def test_config_from_json_fills_fields_added_later():
    cfg = ModelConfig(**TINY, attention="lsh", n_hashes=3, lsh_chunk_size=4)
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    old = {k: v for k, v in cfg._asdict().items() if k not in ("n_hashes", "lsh_chunk_size")}
    import json
    assert ModelConfig.from_json(json.dumps(old)) == cfg._replace(n_hashes=1, lsh_chunk_size=32)
    with pytest.raises(ValueError, match="fields"):
        ModelConfig.from_json(json.dumps({k: v for k, v in old.items() if k != "d_mlp"}))
    with pytest.raises(ValueError, match="fields"):
        ModelConfig.from_json(json.dumps({**old, "rounds": 2}))
