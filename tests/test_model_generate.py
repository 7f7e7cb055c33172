"""Generation: the RNN form and the key/value cache pick exactly the tokens that
recomputing the parallel form picks; sampling is seeded. The prompt, read in one parallel
pass per layer, leaves the memories and gives the tokens of stepping through it. The lean
loop ``generate`` runs (``model.fast.token_loop``) computes what the reference ``step``
computes, token for token, and ``generate(path="reference")`` runs ``step`` itself."""
import numpy as np
import pytest

from linattn.model import prefill, token_step
from linattn.model.fast import rnn_token, token_loop
from linattn.model.config import ModelConfig
from linattn.model.generate import KVCache, generate, sample, step
from linattn.model.transformer import forward, init_params

# learned positions make a random model's greedy continuation vary along the sequence
BASE = dict(vocab_size=9, max_len=24, d_model=16, n_layers=2, n_heads=4, d_mlp=32,
            positions="learned")


def _model(attention, dtype="float64", **kw):
    """A random model with sharper logits than at init, and biases and layer-norm gains
    that are not their init's 0 and 1 (a bias read from the wrong place would not show),
    the output's bias too, scaled down so that no token dominates."""
    cfg = ModelConfig(**{**BASE, **kw}, attention=attention, dtype=dtype)
    params = init_params(cfg, seed=5)
    params["w_out"] = params["w_out"] * 4
    rng = np.random.default_rng(8)
    for name, a in params.items():
        if a.ndim == 1:
            scale = 0.05 if name == "b_out" else 0.3
            params[name] = a + rng.normal(0.0, scale, a.shape).astype(a.dtype)
    return cfg, params


def _prompt(b=3, p=4):
    return np.random.default_rng(6).integers(0, BASE["vocab_size"], (b, p))


@pytest.mark.parametrize("attention, fast, kw", [
    ("linear", "recurrent", {}),
    ("linear", "recurrent", dict(feature_map="favor", positions="sinusoidal")),
    ("softmax", "cache", {}),
])
def test_step_logits_match_the_parallel_form(attention, fast, kw):
    cfg, params = _model(attention, **kw)
    ids = _prompt(2, 10)
    want, _ = forward(params, cfg, ids)
    memories = (None,) * cfg.n_layers
    if fast == "cache":
        shape = (2, cfg.n_heads, 10, cfg.d_head)
        memories = tuple(KVCache(np.zeros(shape), np.zeros(shape)) for _ in range(2))
    for t in range(10):
        logits, memories = step(params, cfg, ids[:, t], t, memories)
        np.testing.assert_allclose(logits, want[:, t], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("attention, fast", [("linear", "recurrent"), ("softmax", "cache")])
def test_greedy_generation_matches_recomputing(attention, fast, dtype):
    cfg, params = _model(attention, dtype)
    prompt = _prompt()
    want = generate(params, cfg, prompt, 20, method="recompute")
    got = generate(params, cfg, prompt, 20, method=fast)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[:, :4], prompt)
    # a real continuation: it varies along the sequence and depends on the prompt
    assert len(np.unique(got[0, 4:])) > 3 and len({tuple(row) for row in got[:, 4:]}) > 1


def _step_memories(cfg, b, n):
    """``step``'s empty memories for b sequences of up to n positions."""
    if cfg.attention == "linear":
        return (None,) * cfg.n_layers                     # s_0 = z_0 = 0
    shape = (b, cfg.n_heads, n, cfg.d_head)
    return tuple(KVCache(np.zeros(shape, cfg.dtype), np.zeros(shape, cfg.dtype))
                 for _ in range(cfg.n_layers))


def _by_step(params, cfg, prompt, n_new, temperature=0.0, seed=0):
    """The reference loop: ``step`` with the NumPy layers and a fresh memory, then
    ``sample``, as ``generate`` ran before its lean loop."""
    b, n_prompt = prompt.shape
    total = n_prompt + n_new
    tokens = np.zeros((b, total), dtype=np.int64)
    tokens[:, :n_prompt] = prompt
    memories = _step_memories(cfg, b, total)
    rng = np.random.default_rng(seed)
    for t in range(total - 1):
        logits, memories = step(params, cfg, tokens[:, t], t, memories)
        if t + 1 >= n_prompt:
            tokens[:, t + 1] = sample(logits, temperature, rng)
    return tokens


# the model variants the lean loop must follow: both attentions, a feature map the RNN
# kernel does not fuse (favor), ReLU, fixed positions
VARIANTS = [("linear", {}), ("linear", dict(feature_map="favor", positions="sinusoidal")),
            ("linear", dict(activation="relu")), ("softmax", {}),
            ("softmax", dict(activation="relu", positions="sinusoidal"))]


@pytest.mark.parametrize("attention, kw", VARIANTS)
@pytest.mark.parametrize("b", [1, 3])
def test_lean_logits_match_the_step_function(attention, kw, b):
    # float64: every position's logits, not just their argmax, within rounding
    cfg, params = _model(attention, **kw)
    ids = _prompt(b, 12)
    weights = token_loop.prepare(params, cfg, 12)
    buf = token_loop.buffers(cfg, b, 12)
    lean, memories = token_loop.memories(cfg, b, 12), _step_memories(cfg, b, 12)
    for t in range(12):
        want, memories = step(params, cfg, ids[:, t], t, memories)
        got = token_loop.token_logits(weights, buf, lean, cfg, ids[:, t], t)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("attention, kw", VARIANTS)
@pytest.mark.parametrize("b, p", [(1, 1), (1, 5), (4, 1), (4, 5)])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_lean_generation_matches_the_step_loop(attention, kw, b, p, temperature):
    # float64, the same seed: the same tokens, greedy or sampled, any batch and prompt
    cfg, params = _model(attention, **kw)
    prompt = _prompt(b, p)
    got = generate(params, cfg, prompt, 12, temperature=temperature, seed=3)
    np.testing.assert_array_equal(got, _by_step(params, cfg, prompt, 12, temperature, 3))
    np.testing.assert_array_equal(got[:, :p], prompt)


@pytest.mark.parametrize("attention, kw", VARIANTS[:1] + VARIANTS[3:4])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_reference_path_is_the_step_loop(attention, kw, temperature):
    # path="reference" runs ``step`` a token at a time: exactly the tokens of the loop above
    cfg, params = _model(attention, **kw)
    prompt = _prompt(2, 3)
    got = generate(params, cfg, prompt, 8, temperature=temperature, seed=4, path="reference")
    np.testing.assert_array_equal(got, _by_step(params, cfg, prompt, 8, temperature, 4))


@pytest.mark.parametrize("attention", ["linear", "softmax"])
def test_lean_float32_greedy_tokens_match_the_step_loop(attention):
    cfg, params = _model(attention, "float32")
    prompt = _prompt(3, 2)
    np.testing.assert_array_equal(generate(params, cfg, prompt, 20),
                                  _by_step(params, cfg, prompt, 20))


@pytest.mark.parametrize("b", [1, 3])
def test_lean_buffers_q_k_v_are_views_of_qkv(b):
    # the RNN reads q, k, v through views made once: each must see what qkv holds
    cfg, _ = _model("linear")
    buf = token_loop.buffers(cfg, b, 5)
    buf.qkv[:] = np.arange(buf.qkv.size).reshape(buf.qkv.shape)
    for i, view in enumerate((buf.q, buf.k, buf.v)):
        part = buf.qkv[i * cfg.d_model:(i + 1) * cfg.d_model].T     # (B, D)
        np.testing.assert_array_equal(view.reshape(b, cfg.d_model), part)
        assert np.shares_memory(view, buf.qkv)


def test_lean_loop_leaves_the_parameters_alone():
    cfg, params = _model("softmax")
    before = {name: a.copy() for name, a in params.items()}
    generate(params, cfg, _prompt(), 6)
    assert all(np.array_equal(params[name], a) for name, a in before.items())


def test_recurrent_state_is_constant_size():
    # the linear model's memory after t tokens has the same shape for every t: (S, z) only
    cfg, params = _model("linear")
    memories = (None,) * cfg.n_layers
    shapes = []
    for t in range(6):
        _, memories = step(params, cfg, np.array([1, 2]), t, memories)
        shapes.append([(m.S.shape, m.z.shape) for m in memories])
    assert all(s == shapes[0] for s in shapes)
    assert shapes[0][0] == ((2, 4, 4, 4), (2, 4, 4))      # (B, H, F, d_head), (B, H, F)


@pytest.mark.parametrize("attention, fast", [("linear", "recurrent"), ("softmax", "cache")])
def test_sampling_is_seeded_and_agrees_across_forms(attention, fast):
    cfg, params = _model(attention)
    prompt = _prompt()
    a = generate(params, cfg, prompt, 15, method=fast, temperature=1.0, seed=1)
    b = generate(params, cfg, prompt, 15, method="recompute", temperature=1.0, seed=1)
    c = generate(params, cfg, prompt, 15, method=fast, temperature=1.0, seed=2)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_sample_follows_the_distribution():
    logits = np.log(np.array([[0.2, 0.5, 0.3]]))
    rng = np.random.default_rng(0)
    draws = np.array([sample(logits, 1.0, rng)[0] for _ in range(4000)])
    np.testing.assert_allclose(np.bincount(draws, minlength=3) / 4000, [0.2, 0.5, 0.3],
                               atol=0.03)
    assert sample(logits, 0, rng)[0] == 1                  # greedy: the argmax
    cold = [sample(logits, 0.01, rng)[0] for _ in range(50)]
    assert set(cold) == {1}                                # low temperature: ~greedy


@pytest.mark.parametrize("attention, kwargs, match", [
    ("softmax", dict(method="recurrent"), "does not apply"),
    ("linear", dict(method="cache"), "does not apply"),
    ("lsh", dict(method="cache"), "does not apply"),
    ("lsh", dict(method="recurrent"), "does not apply"),
    ("linear", dict(method="beam"), "unknown"),
    ("linear", dict(n_new=22), "max_len"),
    ("linear", dict(temperature=-1.0), "temperature"),
    ("linear", dict(prompt=np.zeros((2, 0), dtype=int)), "prompt"),
    ("linear", dict(prompt=np.full((2, 3), 9)), r"prompt ids must lie in \[0, 9\)"),
    ("softmax", dict(prompt=np.full((2, 3), -1)), "prompt ids"),
    ("linear", dict(path="fast"), "path must be one of lean, reference"),
])
def test_generate_rejects_bad_arguments(attention, kwargs, match):
    cfg, params = _model(attention)
    args = {"prompt": _prompt(), "n_new": 5, **kwargs}
    with pytest.raises(ValueError, match=match):
        generate(params, cfg, args.pop("prompt"), args.pop("n_new"), **args)


def test_generation_may_fill_max_len_exactly():
    # the model reads every token but the last generated one: P + n_new - 1 <= max_len
    cfg, params = _model("linear")
    assert generate(params, cfg, _prompt(1, 4), 21).shape == (1, 25)
    with pytest.raises(ValueError, match="max_len"):
        generate(params, cfg, _prompt(1, 4), 22)


def test_lsh_generates_by_recomputing():
    # no state and no cache: "auto" recomputes the prefix, token for token what forward picks
    cfg, params = _model("lsh", n_hashes=2, lsh_chunk_size=4)
    prompt = _prompt()
    got = generate(params, cfg, prompt, 8)
    np.testing.assert_array_equal(got, generate(params, cfg, prompt, 8, method="recompute"))
    np.testing.assert_array_equal(got[:, :4], prompt)
    logits, _ = forward(params, cfg, got[:, :-1])
    np.testing.assert_array_equal(got[:, -1], logits[:, -1].argmax(axis=-1))


@pytest.mark.parametrize("attention, kw", VARIANTS[:2] + VARIANTS[3:4])
def test_prompt_read_at_once_gives_the_stepped_memories(attention, kw):
    # one parallel causal call per layer leaves each layer where stepping through the
    # prompt leaves it: the RNN's state (S, z), or the cache's keys and values (float64)
    cfg, params = _model(attention, **kw)
    ids = _prompt(3, 9)
    read = token_step.prompt_memories(params, cfg, ids, 12)
    stepped = _step_memories(cfg, 3, 12)
    for t in range(9):
        _, stepped = step(params, cfg, ids[:, t], t, stepped)
    lean = token_loop.memories(cfg, 3, 12, prefill.read_prompt(params, cfg, ids))
    if isinstance(lean, rnn_token.States):              # elu+1: every layer's state at once
        lean = [(s, z) for s, z in zip(lean.s, lean.z)]
    else:
        lean = [m.state if attention == "linear" else (m.keys_t.transpose(0, 1, 3, 2),
                                                       m.values) for m in lean]
    assert len(lean) == cfg.n_layers
    for got, want, fast in zip(read, stepped, lean):
        for a, b, c in zip(got, want, fast):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(c, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("attention, kw", VARIANTS[:2] + VARIANTS[3:4])
@pytest.mark.parametrize("path", ["lean", "reference"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_long_prompt_read_at_once_gives_the_stepped_tokens(attention, kw, path, temperature):
    # a prompt of 16 read in one pass per layer, then 8 tokens: those of stepping through it
    cfg, params = _model(attention, **kw)
    prompt = _prompt(2, 16)
    got = generate(params, cfg, prompt, 8, temperature=temperature, seed=7, path=path)
    np.testing.assert_array_equal(got, _by_step(params, cfg, prompt, 8, temperature, 7))
