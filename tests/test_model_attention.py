"""The multi-head attention layer: head split/merge and its backward against central
finite differences, for softmax, every feature map of linear attention and LSH (float64)."""
import numpy as np
import pytest

from helpers import FEATURE_MAP_NAMES, assert_gradients_match
from linattn.model.attention import (attend, attend_backward, attention, attention_backward,
                                     merge_heads, split_heads)
from linattn.model.config import ModelConfig

NAMES = ("wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo")
CASES = [("softmax", "elu+1")] + [("linear", fm) for fm in FEATURE_MAP_NAMES]


def _config(attention_kind, feature_map, **lsh):
    return ModelConfig(vocab_size=5, max_len=8, d_model=8, n_heads=2, attention=attention_kind,
                       feature_map=feature_map, dtype="float64", **lsh)


def _weights(seed, d=8):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((d, d)) / np.sqrt(d) if n[0] == "w"
            else 0.1 * rng.standard_normal(d)
            for n in NAMES]


def test_split_merge_heads_round_trip():
    x = np.arange(2 * 5 * 6.0).reshape(2, 5, 6)
    heads = split_heads(x, 3)
    assert heads.shape == (2, 3, 5, 2)
    np.testing.assert_array_equal(heads[1, 2, 4], x[1, 4, 4:6])   # head h holds columns h*dh..
    np.testing.assert_array_equal(merge_heads(heads), x)


@pytest.mark.parametrize("attention_kind, feature_map", CASES)
def test_attention_backward(attention_kind, feature_map):
    cfg = _config(attention_kind, feature_map)
    x = np.random.default_rng(1).standard_normal((2, 5, 8))
    weights = dict(zip(NAMES, _weights(2)))
    # softmax is invariant to a key bias (it adds q.b_k to a whole row of logits), so the
    # true gradient of bk is 0 and a relative error meaningless: it is checked apart
    names = [n for n in NAMES if not (attention_kind == "softmax" and n == "bk")]

    def params(w):
        return {**weights, **dict(zip(names, w))}

    def f(x, *w):
        return attention(params(w), x, cfg)[0]

    def f_backward(dy, x, *w):
        p = params(w)
        dx, grads = attention_backward(dy, p, x, attention(p, x, cfg)[1], cfg)
        if attention_kind == "softmax":
            assert np.max(np.abs(grads["bk"])) < 1e-12 * np.max(np.abs(grads["wk"]))
        return (dx, *(grads[n] for n in names))

    assert_gradients_match(f, f_backward, [x, *(weights[n] for n in names)])


@pytest.mark.parametrize("attention_kind", ["softmax", "linear"])
def test_attention_is_causal(attention_kind):
    # changing the last position must leave every earlier output unchanged
    cfg = _config(attention_kind, "elu+1")
    p = dict(zip(NAMES, _weights(3)))
    x = np.random.default_rng(4).standard_normal((1, 6, 8))
    y = attention(p, x, cfg)[0]
    x2 = x.copy()
    x2[:, -1] += 1.0
    y2 = attention(p, x2, cfg)[0]
    np.testing.assert_allclose(y2[:, :-1], y[:, :-1], rtol=1e-12)
    assert not np.allclose(y2[:, -1], y[:, -1])


@pytest.mark.parametrize("n_hashes", [1, 2])
def test_lsh_attention_backward(n_hashes):
    # shared QK: W_Q makes queries and keys, W_K is unused (zero gradient, checked apart)
    cfg = _config("lsh", "elu+1", n_hashes=n_hashes, lsh_chunk_size=2)
    x = np.random.default_rng(5).standard_normal((2, 7, 8))
    weights = dict(zip(NAMES, _weights(6)))
    names = [n for n in NAMES if n not in ("wk", "bk")]

    def params(w):
        return {**weights, **dict(zip(names, w))}

    def f(x, *w):
        return attention(params(w), x, cfg)[0]

    def f_backward(dy, x, *w):
        p = params(w)
        dx, grads = attention_backward(dy, p, x, attention(p, x, cfg)[1], cfg)
        assert not grads["wk"].any() and not grads["bk"].any()
        return (dx, *(grads[n] for n in names))

    assert_gradients_match(f, f_backward, [x, *(weights[n] for n in names)])


@pytest.mark.parametrize("attention_kind", ["softmax", "linear"])
def test_padded_non_causal_attention(attention_kind):
    # each sequence attends over its own positions only; padded positions give 0 and take
    # no gradient; the backward holds to finite differences
    cfg = _config(attention_kind, "elu+1")._replace(causal=False)
    weights = dict(zip(NAMES, _weights(5)))
    x = np.random.default_rng(6).standard_normal((2, 5, 8))
    lengths = [5, 3]
    y, _ = attention(weights, x, cfg, lengths)
    np.testing.assert_allclose(y[1, :3], attention(weights, x[1:, :3], cfg)[0][0], rtol=1e-12)
    np.testing.assert_allclose(y[1, 3:], np.broadcast_to(weights["bo"], (2, 8)), rtol=1e-12)
    x2 = x.copy()
    x2[0, -1] += 1.0                                  # non-causal: the last position is read
    assert not np.allclose(attention(weights, x2, cfg, lengths)[0][0, 0], y[0, 0])
    names = [n for n in NAMES if not (attention_kind == "softmax" and n == "bk")]

    def params(w):
        return {**weights, **dict(zip(names, w))}

    def f(x, *w):
        return attention(params(w), x, cfg, lengths)[0]

    def f_backward(dy, x, *w):
        p = params(w)
        dx, grads = attention_backward(dy, p, x, attention(p, x, cfg, lengths)[1], cfg, lengths)
        assert np.all(dx[1, 3:] == 0)
        return (dx, *(grads[n] for n in names))

    assert_gradients_match(f, f_backward, [x, *(weights[n] for n in names)])


@pytest.mark.parametrize("attention_kind, extra", [
    ("softmax", {}), ("linear", {}), ("lsh", dict(n_hashes=2, lsh_chunk_size=2))])
def test_padded_batch_attends_in_one_call_whatever_the_padding_holds(attention_kind, extra):
    # NaN in every padded key and value, loud noise in every padded query: masked keys and
    # zeroed padded queries, so each sequence's real rows are what it gets alone and the
    # padded rows are 0; dropping the mask would spread the NaN into every real row
    cfg = _config(attention_kind, "elu+1", **extra)._replace(causal=False)
    rng = np.random.default_rng(7)
    q, k, v, dout = (rng.standard_normal((3, 2, 6, 4)) for _ in range(4))
    lengths = np.array([6, 2, 4])
    padded = np.broadcast_to((np.arange(6) >= lengths[:, None])[:, None], (3, 2, 6))
    k[padded], v[padded] = np.nan, np.nan
    q[padded] = 1e3 * rng.standard_normal(q[padded].shape)
    k = None if attention_kind == "lsh" else k
    out = attend(q, k, v, cfg, lengths)
    grads = attend_backward(dout, q, k, v, cfg, lengths)
    assert np.all(out[padded] == 0)
    for g in grads:
        assert g is None or np.all(g[padded] == 0)
    for b, n in enumerate(lengths):
        alone = [None if a is None else a[b, :, :n] for a in (q, k, v)]
        np.testing.assert_allclose(out[b, :, :n], attend(*alone, cfg), rtol=1e-12, atol=1e-14)
        for g, want in zip(grads, attend_backward(dout[b, :, :n], *alone, cfg)):
            if want is not None:
                np.testing.assert_allclose(g[b, :, :n], want, rtol=1e-12, atol=1e-14)
