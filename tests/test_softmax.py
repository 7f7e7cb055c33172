"""Softmax attention: Eq. (2) and (8) against a transcription of Eq. (3), and its backward."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from linattn import softmax_attention, softmax_attention_backward

from helpers import assert_gradients_match, random_qkv

BACKENDS = ("numpy", "numba")


def transcription(q, k, v, causal, scale):
    """Eq. (3) with sim(q, k) = exp(scale q.k), one (i, j) pair at a time, for 2-D inputs."""
    n, m = v.shape
    out = np.zeros((n, m))
    for i in range(n):
        js = range(i + 1) if causal else range(n)
        sims = [np.exp(scale * q[i] @ k[j]) for j in js]
        out[i] = sum(s * v[j] for s, j in zip(sims, js)) / sum(sims)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@given(n=st.integers(1, 12), d=st.integers(1, 5), m=st.integers(1, 5), causal=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_matches_transcription_of_eq3(backend, n, d, m, causal, seed):
    q, k, v = random_qkv(seed, n, d, m)
    want = transcription(q, k, v, causal, d ** -0.5)
    np.testing.assert_allclose(softmax_attention(q, k, v, causal=causal, backend=backend), want,
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lead", [(), (2,), (2, 3)])
def test_leading_axes_are_independent(backend, causal, lead):
    q, k, v = random_qkv(1, 7, 3, 4, lead)
    got = softmax_attention(q, k, v, causal=causal, backend=backend)
    for idx in np.ndindex(lead):
        want = transcription(q[idx], k[idx], v[idx], causal, 3 ** -0.5)
        np.testing.assert_allclose(got[idx], want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [None, 0.7])
def test_backward_matches_finite_differences(backend, causal, scale):
    q, k, v = random_qkv(2, 5, 3, 4, (2,))
    kw = dict(causal=causal, scale=scale, backend=backend)
    assert_gradients_match(
        lambda q, k, v: softmax_attention(q, k, v, **kw),
        lambda dout, q, k, v: softmax_attention_backward(dout, q, k, v, **kw),
        (q, k, v))


@given(n=st.integers(0, 40), d=st.integers(1, 5), m=st.integers(1, 40),
       lead=st.sampled_from([(), (1,), (2, 3)]), causal=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_numba_backward_matches_numpy(n, d, m, lead, causal, seed):
    q, k, v = random_qkv(seed, n, d, m, lead)
    dout = np.random.default_rng(seed + 1).standard_normal(v.shape)
    want = softmax_attention_backward(dout, q, k, v, causal=causal, backend="numpy")
    got = softmax_attention_backward(dout, q, k, v, causal=causal, backend="numba")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_huge_logits_do_not_overflow(backend, causal):
    q, k, v = random_qkv(3, 6, 4, 2)
    out = softmax_attention(q * 1e4, k, v, causal=causal, backend=backend)
    assert np.all(np.isfinite(out))
    # at such a temperature each row is a hard maximum: one value row, exactly
    logits = (q * 1e4) @ k.T
    if causal:
        logits = np.where(np.tril(np.ones((6, 6), bool)), logits, -np.inf)
    np.testing.assert_allclose(out, v[np.argmax(logits, axis=1)], rtol=1e-12)
    grads = softmax_attention_backward(np.ones_like(out), q * 1e4, k, v, causal=causal,
                                       backend=backend)
    assert all(np.all(np.isfinite(g)) for g in grads)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_query_row_poisons_only_its_row(backend):
    q, k, v = random_qkv(4, 5, 3, 2)
    q[2, 1] = np.nan
    for causal in (False, True):
        out = softmax_attention(q, k, v, causal=causal, backend=backend)
        assert np.all(np.isnan(out[2]))
        assert np.all(np.isfinite(np.delete(out, 2, axis=0)))
