"""Cross-attention: queries and keys of different lengths, q (..., Nq, D), k (..., Nk, D),
v (..., Nk, M), without a causal mask, on every backend with a non-causal path, held to the
quadratic oracle and to central finite differences like the self-attention paths."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from linattn import (linear_attention, linear_attention_backward, softmax_attention,
                     softmax_attention_backward)

from helpers import assert_gradients_match

LINEAR = [("numpy", "linear"), ("numpy", "chunked"), ("numpy", "recurrent"),
          ("numba", "linear"), ("numba", "chunked"), ("numba", "auto")]


def cross_qkv(seed, n_q, n_k, d, m, lead=(), dtype=np.float64):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((*lead, n_q, d)).astype(dtype)
    k = rng.standard_normal((*lead, n_k, d)).astype(dtype)
    v = rng.standard_normal((*lead, n_k, m)).astype(dtype)
    return q, k, v


shapes = dict(n_q=st.integers(1, 40), n_k=st.integers(1, 40), d=st.integers(1, 7),
              m=st.integers(1, 7), lead=st.sampled_from([(), (3,), (2, 2)]),
              seed=st.integers(0, 2**32 - 1))


@pytest.mark.parametrize("backend, method", LINEAR)
@given(**shapes)
def test_linear_cross_matches_quadratic(backend, method, n_q, n_k, d, m, lead, seed):
    q, k, v = cross_qkv(seed, n_q, n_k, d, m, lead)
    dout = np.random.default_rng(seed + 1).standard_normal((*lead, n_q, m))
    kw = dict(causal=False, chunk_size=5)
    want = linear_attention(q, k, v, method="quadratic", backend="numpy", **kw)
    got = linear_attention(q, k, v, method=method, backend=backend, **kw)
    assert got.shape == (*lead, n_q, m)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    wants = linear_attention_backward(dout, q, k, v, method="quadratic", backend="numpy", **kw)
    gots = linear_attention_backward(dout, q, k, v, method=method, backend=backend, **kw)
    for g, w, x in zip(gots, wants, (q, k, v)):
        assert g.shape == x.shape
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@given(**shapes)
def test_softmax_cross_matches_the_formula(backend, n_q, n_k, d, m, lead, seed):
    q, k, v = cross_qkv(seed, n_q, n_k, d, m, lead)
    logits = q @ k.swapaxes(-1, -2) / np.sqrt(d)                       # (..., Nq, Nk)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    want = (p / p.sum(axis=-1, keepdims=True)) @ v
    got = softmax_attention(q, k, v, backend=backend)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    dout = np.random.default_rng(seed + 1).standard_normal(want.shape)
    wants = softmax_attention_backward(dout, q, k, v, backend="numpy")
    gots = softmax_attention_backward(dout, q, k, v, backend=backend)
    for g, w, x in zip(gots, wants, (q, k, v)):
        assert g.shape == x.shape
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n_q, n_k", [(1, 6), (5, 2), (3, 3)])
def test_cross_gradients_match_finite_differences(n_q, n_k):
    q, k, v = cross_qkv(0, n_q, n_k, 3, 2)
    assert_gradients_match(lambda q, k, v: linear_attention(q, k, v, backend="numpy"),
                           lambda dout, q, k, v: linear_attention_backward(
                               dout, q, k, v, backend="numpy"), (q, k, v))
    assert_gradients_match(lambda q, k, v: softmax_attention(q, k, v, backend="numpy"),
                           lambda dout, q, k, v: softmax_attention_backward(
                               dout, q, k, v, backend="numpy"), (q, k, v))


def test_one_query_against_a_cache_is_the_last_causal_row():
    """Nq = 1 against the keys so far is the softmax generation step."""
    q, k, v = cross_qkv(3, 9, 9, 4, 5, lead=(2,))
    want = softmax_attention(q, k, v, causal=True)[..., -1:, :]
    for backend in ("numpy", "numba"):
        got = softmax_attention(q[..., -1:, :], k, v, backend=backend)
        np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("f", [linear_attention, softmax_attention])
def test_causal_needs_one_length(f):
    q, k, v = cross_qkv(0, 4, 5, 3, 2)
    with pytest.raises(ValueError, match="Nq == Nk"):
        f(q, k, v, causal=True)


@pytest.mark.parametrize("f", [linear_attention, softmax_attention])
def test_keys_and_values_need_one_length(f):
    q, k, v = cross_qkv(0, 4, 5, 3, 2)
    with pytest.raises(ValueError, match="Nk"):
        f(q, k, v[..., :4, :])


def test_dout_has_the_query_length():
    q, k, v = cross_qkv(0, 4, 5, 3, 2)
    with pytest.raises(ValueError, match="dout"):
        linear_attention_backward(np.ones((5, 2)), q, k, v)


def test_softmax_over_no_keys_is_an_error():
    q, k, v = cross_qkv(0, 4, 0, 3, 2)
    with pytest.raises(ValueError, match="at least one key"):
        softmax_attention(q, k, v)
    assert softmax_attention(q[:0], k, v).shape == (0, 2)     # no queries: nothing to do
