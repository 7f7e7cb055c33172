"""Reformer (LSH) attention: equal to softmax attention restricted to its mask, for any number
of rounds; the mask against a transcription of the sort-and-chunk rule; Numba against
NumPy; the backward against central differences with the buckets held fixed; bad inputs."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from linattn import lsh_attention, lsh_attention_backward, lsh_attention_mask
from linattn.forms import lsh as forms_lsh

from helpers import assert_gradients_match, assert_lsh_backends_agree, random_qkv

BACKENDS = ("numpy", "numba")


def random_qkv2(seed, n, d, m, lead=(), dtype=np.float64):
    q, _, v = random_qkv(seed, n, d, m, lead, dtype)
    return q, v


def masked_softmax(qk, v, mask):
    """The oracle: softmax(qk k^T / sqrt(D)) v with -inf outside ``mask``, k the unit rows."""
    k = qk / np.linalg.norm(qk, axis=-1, keepdims=True)
    logits = np.where(mask, qk @ k.swapaxes(-1, -2) / np.sqrt(qk.shape[-1]), -np.inf)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def transcribed_mask(qk, n_hashes, chunk_size, causal, seed):
    """The mask rule of ``forms.lsh``, one round and one pair at a time, for 2-D qk."""
    n, d = qk.shape
    n_buckets = max(2, 2 * -(-n // chunk_size))
    seen = np.zeros((n, n), dtype=bool)
    for rotation in np.random.default_rng(seed).standard_normal((n_hashes, d, n_buckets // 2)):
        def bucket(j):
            x = list(qk[j] / np.linalg.norm(qk[j]) @ rotation)
            scores = x + [-s for s in x]
            return scores.index(max(scores))              # argmax([xR, -xR]), first on ties
        order = sorted(range(n), key=lambda j: (bucket(j), j))
        chunk = {pos: rank // chunk_size for rank, pos in enumerate(order)}
        for i in range(n):
            for j in range(n):
                if chunk[j] in (chunk[i], chunk[i] - 1) and i != j and (j <= i or not causal):
                    seen[i, j] = True
    for i in range(n):
        seen[i, i] = not seen[i].any()                     # itself, only when alone
    return seen


OPTIONS = dict(n=st.integers(1, 70), d=st.integers(1, 6), m=st.integers(1, 5),
               chunk_size=st.integers(1, 9), n_hashes=st.integers(1, 4), causal=st.booleans(),
               seed=st.integers(0, 2**32 - 1))


@given(lead=st.sampled_from([(), (2,), (2, 3)]), **OPTIONS)
def test_equals_softmax_restricted_to_the_mask(lead, n, d, m, chunk_size, n_hashes, causal,
                                               seed):
    qk, v = random_qkv2(seed, n, d, m, lead)
    kw = dict(n_hashes=n_hashes, chunk_size=chunk_size, causal=causal, seed=seed % 1000)
    mask = lsh_attention_mask(qk, **kw)
    want = masked_softmax(qk, v, mask)
    got = lsh_attention(qk, v, backend="numpy", **kw)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@given(n=st.integers(1, 24), d=st.integers(1, 4), chunk_size=st.integers(1, 5),
       n_hashes=st.integers(1, 3), causal=st.booleans(), seed=st.integers(0, 1000))
def test_mask_matches_a_transcription(n, d, chunk_size, n_hashes, causal, seed):
    qk, _ = random_qkv2(seed, n, d, 1)
    got = lsh_attention_mask(qk, n_hashes=n_hashes, chunk_size=chunk_size, causal=causal,
                             seed=seed)
    np.testing.assert_array_equal(got, transcribed_mask(qk, n_hashes, chunk_size, causal, seed))
    assert got.any(axis=-1).all()                          # every query sees some key
    if causal:
        assert not np.triu(got, 1).any()


@given(lead=st.sampled_from([(), (1,), (2, 3)]), **OPTIONS)
def test_numba_matches_numpy(lead, n, d, m, chunk_size, n_hashes, causal, seed):
    qk, v = random_qkv2(seed, n, d, m, lead)
    dout = np.random.default_rng(seed + 1).standard_normal(v.shape)
    kw = dict(n_hashes=n_hashes, chunk_size=chunk_size, causal=causal, seed=seed % 1000)
    assert_lsh_backends_agree(qk, v, dout, **kw)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_hashes", [1, 3])
def test_numba_float32_matches_numpy(causal, n_hashes):
    qk, v = random_qkv2(5, 200, 16, 8, (2,), np.float32)
    dout = np.random.default_rng(6).standard_normal(v.shape).astype(np.float32)
    kw = dict(n_hashes=n_hashes, chunk_size=8, causal=causal)
    got = lsh_attention(qk, v, backend="numba", **kw)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, lsh_attention(qk, v, backend="numpy", **kw),
                               rtol=1e-4, atol=1e-5)
    for g, w in zip(lsh_attention_backward(dout, qk, v, backend="numba", **kw),
                    lsh_attention_backward(dout, qk, v, backend="numpy", **kw)):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_hashes, chunk_size, causal", [
    (1, 2, False), (1, 3, True), (2, 2, False), (3, 2, True), (2, 4, True), (1, 20, False)])
def test_backward_matches_finite_differences(backend, n_hashes, chunk_size, causal):
    qk, v = random_qkv2(7, 9, 3, 2, (2,))
    kw = dict(n_hashes=n_hashes, chunk_size=chunk_size, causal=causal, seed=3)
    buckets = lsh_attention_mask(qk, **kw)

    def f(qk, v):
        # the hash is piecewise constant: a step of 1e-6 must not move any position
        np.testing.assert_array_equal(lsh_attention_mask(qk, **kw), buckets)
        return lsh_attention(qk, v, backend=backend, **kw)

    assert_gradients_match(
        f, lambda dout, qk, v: lsh_attention_backward(dout, qk, v, backend=backend, **kw),
        (qk, v))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_hashes", [1, 2, 4])
def test_one_chunk_is_shared_qk_softmax_without_self(causal, n_hashes):
    n = 11
    qk, v = random_qkv2(8, n, 4, 3, (2,))
    others = ~np.eye(n, dtype=bool) & (np.tri(n, dtype=bool) if causal else True)
    alone = ~others.any(axis=-1)                            # causal: the first position
    want = masked_softmax(qk, v, others | np.diag(alone))
    for backend in BACKENDS:
        got = lsh_attention(qk, v, n_hashes=n_hashes, chunk_size=n + 3, causal=causal,
                            backend=backend)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_leading_axes_are_independent():
    qk, v = random_qkv2(9, 30, 4, 3, (2, 3))
    kw = dict(n_hashes=2, chunk_size=4, causal=True, seed=5)
    for backend in BACKENDS:
        got = lsh_attention(qk, v, backend=backend, **kw)
        for idx in np.ndindex(2, 3):
            np.testing.assert_allclose(got[idx], lsh_attention(qk[idx], v[idx], **kw),
                                       rtol=1e-12)


def test_seed_is_deterministic_and_matters():
    qk, v = random_qkv2(10, 64, 8, 3)
    kw = dict(n_hashes=2, chunk_size=4)
    np.testing.assert_array_equal(lsh_attention(qk, v, seed=1, **kw),
                                  lsh_attention(qk, v, seed=1, **kw))
    np.testing.assert_array_equal(lsh_attention_mask(qk, seed=1, **kw),
                                  lsh_attention_mask(qk, seed=1, **kw))
    assert not np.array_equal(lsh_attention_mask(qk, seed=1, **kw),
                              lsh_attention_mask(qk, seed=2, **kw))


def test_default_bucket_count():
    assert [forms_lsh.default_n_buckets(n, 4) for n in (1, 4, 5, 8, 9, 100)] == [2, 2, 4, 4, 6, 50]
    qk, v = random_qkv2(11, 37, 5, 2)
    np.testing.assert_array_equal(lsh_attention_mask(qk, chunk_size=4),
                                  lsh_attention_mask(qk, chunk_size=4, n_buckets=20))
    assert not np.array_equal(lsh_attention_mask(qk, chunk_size=4),
                              lsh_attention_mask(qk, chunk_size=4, n_buckets=2))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_huge_logits_do_not_overflow(backend, causal):
    qk, v = random_qkv2(12, 40, 4, 2)
    qk *= 1e4
    kw = dict(n_hashes=2, chunk_size=5, causal=causal)
    out = lsh_attention(qk, v, backend=backend, **kw)
    # at such a temperature each row picks its largest allowed logit: one value row, exactly
    mask = lsh_attention_mask(qk, **kw)
    k = qk / np.linalg.norm(qk, axis=-1, keepdims=True)
    np.testing.assert_allclose(out, v[np.argmax(np.where(mask, qk @ k.T, -np.inf), axis=1)],
                               rtol=1e-12)
    grads = lsh_attention_backward(np.ones_like(out), qk, v, backend=backend, **kw)
    assert all(np.all(np.isfinite(g)) for g in grads)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_nan_stays_with_the_queries_that_see_it(backend, causal):
    qk, v = random_qkv2(13, 30, 3, 2, (2,))
    qk[1, 7, 0] = np.nan
    kw = dict(n_hashes=2, chunk_size=4, causal=causal)
    out = lsh_attention(qk, v, backend=backend, **kw)
    assert np.all(np.isfinite(out[0]))                     # the other leading index
    sees = lsh_attention_mask(qk, **kw)[1, :, 7]
    sees[7] = True                                         # a NaN query: its own row
    assert np.all(np.isnan(out[1, sees])) and np.all(np.isfinite(out[1, ~sees]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_sequence_and_float16(backend):
    qk, v = np.zeros((2, 0, 3)), np.zeros((2, 0, 4))
    assert lsh_attention(qk, v, backend=backend).shape == (2, 0, 4)
    assert [g.shape for g in lsh_attention_backward(v, qk, v, backend=backend)] == \
        [(2, 0, 3), (2, 0, 4)]
    qk, v = random_qkv2(14, 9, 3, 2, (), np.float16)
    out = lsh_attention(qk, v, chunk_size=2, backend=backend)
    assert out.dtype == np.float16
    want = lsh_attention(qk.astype(np.float32), v.astype(np.float32), chunk_size=2)
    np.testing.assert_allclose(out, want.astype(np.float16), rtol=1e-3)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(n_buckets=3), ValueError, "even"),
    (dict(n_buckets=0), ValueError, "n_buckets must be at least 2"),
    (dict(chunk_size=0), ValueError, "chunk_size must be at least 1"),
    (dict(chunk_size=2.5), TypeError, "chunk_size must be an integer"),
    (dict(n_hashes=0), ValueError, "n_hashes must be at least 1"),
    (dict(n_hashes=True), TypeError, "n_hashes must be an integer"),
    (dict(seed=-1), ValueError, "seed must be at least 0"),
    (dict(causal="yes"), TypeError, "causal must be True or False"),
    (dict(backend="cupy"), ValueError, "no cupy kernel"),
    (dict(backend="torch"), ValueError, "unknown backend"),
])
def test_bad_options(kwargs, error, match):
    qk, v = random_qkv2(15, 6, 3, 2)
    with pytest.raises(error, match=match):
        lsh_attention(qk, v, **kwargs)
    with pytest.raises(error, match=match):
        lsh_attention_backward(v, qk, v, **kwargs)
    if "backend" not in kwargs:
        with pytest.raises(error, match=match):
            lsh_attention_mask(qk, **kwargs)


@pytest.mark.parametrize("qk_shape, v_shape, match", [
    ((5,), (5, 2), "shape"), ((5, 3), (4, 2), "same leading"),
    ((2, 5, 3), (3, 5, 2), "same leading"), ((5, 0), (5, 2), "D >= 1")])
def test_bad_shapes(qk_shape, v_shape, match):
    with pytest.raises(ValueError, match=match):
        lsh_attention(np.ones(qk_shape), np.ones(v_shape))


def test_bad_dout_shape():
    with pytest.raises(ValueError, match="dout"):
        lsh_attention_backward(np.ones((5, 3)), np.ones((5, 3)), np.ones((5, 2)))


@pytest.mark.parametrize("dtype", [np.int64, np.bool_, np.complex128])
def test_non_float_inputs_are_type_errors(dtype):
    with pytest.raises(TypeError, match="qk must be a float"):
        lsh_attention(np.ones((5, 3), dtype), np.ones((5, 2)))
    with pytest.raises(TypeError, match="v must be a float"):
        lsh_attention(np.ones((5, 3)), np.ones((5, 2), dtype))
