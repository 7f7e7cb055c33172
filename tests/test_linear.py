"""Linear attention: every method agrees with the quadratic oracle, Eq. (4)-(6) and (8)-(12),
forward and backward; gradients against finite differences; dtypes, edge cases, bad input."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from linattn import Favor, linear_attention, linear_attention_backward

from helpers import FEATURE_MAP_NAMES, assert_gradients_match, random_qkv, relative_error

FAST_METHODS = ("linear", "chunked", "recurrent", "auto")  # on NumPy and on Numba alike
ALL_METHODS = ("quadratic",) + FAST_METHODS
BACKENDS = ("numpy", "numba")
# every (method, backend) pair that runs; the NumPy quadratic form is the oracle
PATHS = [("quadratic", "numpy")] + [(m, b) for b in BACKENDS for m in FAST_METHODS]
FAST_PATHS = PATHS[1:]
leads = st.sampled_from([(), (2,), (2, 3)])


def feature_map(name):
    return Favor(n_features=5, seed=1) if name == "favor" else name


def eq4_transcription(q, k, v, causal, phi, eps):
    """Eq. (4) / (8) one (i, j) pair at a time, for 2-D inputs."""
    n, m = v.shape
    out = np.zeros((n, m))
    for i in range(n):
        js = range(i + 1) if causal else range(n)
        sims = [phi.forward(q[i]) @ phi.forward(k[j]) for j in js]
        out[i] = sum(s * v[j] for s, j in zip(sims, js)) / (sum(sims) + eps)
    return out


@given(n=st.integers(1, 9), d=st.integers(1, 4), m=st.integers(1, 4), causal=st.booleans(),
       fmap=st.sampled_from(FEATURE_MAP_NAMES), seed=st.integers(0, 2**32 - 1))
def test_quadratic_oracle_is_eq4(n, d, m, causal, fmap, seed):
    from linattn.feature_maps import get_feature_map
    q, k, v = random_qkv(seed, n, d, m)
    phi = get_feature_map(feature_map(fmap))
    want = eq4_transcription(q, k, v, causal, phi, 1e-6)
    got = linear_attention(q, k, v, causal=causal, feature_map=phi, method="quadratic")
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@given(n=st.integers(1, 33), d=st.integers(1, 6), m=st.integers(1, 6), lead=leads,
       causal=st.booleans(), chunk=st.integers(1, 8), fmap=st.sampled_from(FEATURE_MAP_NAMES),
       method=st.sampled_from(FAST_METHODS), seed=st.integers(0, 2**32 - 1))
def test_methods_match_quadratic(backend, n, d, m, lead, causal, chunk, fmap, method, seed):
    q, k, v = random_qkv(seed, n, d, m, lead)
    kw = dict(causal=causal, feature_map=feature_map(fmap), chunk_size=chunk)
    want = linear_attention(q, k, v, method="quadratic", backend="numpy", **kw)
    got = linear_attention(q, k, v, method=method, backend=backend, **kw)
    assert got.shape == want.shape == (*lead, n, m)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@given(n=st.integers(1, 20), d=st.integers(1, 5), m=st.integers(1, 5), lead=leads,
       causal=st.booleans(), chunk=st.integers(1, 6), fmap=st.sampled_from(FEATURE_MAP_NAMES),
       method=st.sampled_from(FAST_METHODS), seed=st.integers(0, 2**32 - 1))
def test_method_gradients_match_quadratic(backend, n, d, m, lead, causal, chunk, fmap, method,
                                          seed):
    q, k, v = random_qkv(seed, n, d, m, lead)
    dout = np.random.default_rng(seed + 1).standard_normal(v.shape)
    kw = dict(causal=causal, feature_map=feature_map(fmap), chunk_size=chunk)
    want = linear_attention_backward(dout, q, k, v, method="quadratic", backend="numpy", **kw)
    got = linear_attention_backward(dout, q, k, v, method=method, backend=backend, **kw)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("method, backend", PATHS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("fmap", FEATURE_MAP_NAMES)
def test_backward_matches_finite_differences(method, backend, causal, fmap):
    q, k, v = random_qkv(7, 5, 3, 2, (2,))
    kw = dict(causal=causal, feature_map=feature_map(fmap), method=method, backend=backend,
              chunk_size=2)
    assert_gradients_match(lambda q, k, v: linear_attention(q, k, v, **kw),
                           lambda dout, q, k, v: linear_attention_backward(dout, q, k, v, **kw),
                           (q, k, v))


@pytest.mark.parametrize("method, backend", PATHS)
def test_noncausal_output_is_permutation_equivariant(method, backend):
    # a property of Eq. (5): shuffling positions shuffles outputs the same way
    q, k, v = random_qkv(8, 10, 3, 2)
    perm = np.random.default_rng(0).permutation(10)
    kw = dict(method=method, backend=backend, chunk_size=3)
    out = linear_attention(q, k, v, **kw)
    np.testing.assert_allclose(linear_attention(q[perm], k[perm], v[perm], **kw), out[perm],
                               rtol=1e-10)


@pytest.mark.parametrize("method, backend", PATHS)
def test_causal_output_ignores_the_future(method, backend):
    q, k, v = random_qkv(9, 12, 3, 2)
    kw = dict(causal=True, method=method, backend=backend, chunk_size=5)
    out = linear_attention(q, k, v, **kw)
    q2, k2, v2 = (np.concatenate([x[:7], -x[7:]]) for x in (q, k, v))
    out2 = linear_attention(q2, k2, v2, **kw)
    np.testing.assert_array_equal(out[:7], out2[:7])


@pytest.mark.parametrize("method, backend", [(m, b) for m, b in FAST_PATHS if m != "auto"])
@pytest.mark.parametrize("causal", [False, True])
def test_float32_stays_float32_and_close_to_float64_at_n8192(method, backend, causal):
    q, k, v = random_qkv(10, 8192, 16, 16, (2,))
    dout = np.random.default_rng(11).standard_normal(v.shape)
    args32 = [x.astype(np.float32) for x in (q, k, v)]
    kw = dict(causal=causal, method=method, backend=backend)
    out32 = linear_attention(*args32, **kw)
    out64 = linear_attention(q, k, v, **kw)
    assert out32.dtype == np.float32
    assert relative_error(out32, out64) < 1e-4
    # NumPy's loops are slow in Python: its chunked form stands for their backward
    if method == "chunked" or backend == "numba":
        g32 = linear_attention_backward(dout.astype(np.float32), *args32, **kw)
        g64 = linear_attention_backward(dout, q, k, v, **kw)
        for a, b in zip(g32, g64):
            assert a.dtype == np.float32 and relative_error(a, b) < 1e-4


@pytest.mark.parametrize("method, backend", PATHS)
def test_float16_computes_in_float32_and_returns_float16(method, backend):
    q, k, v = random_qkv(12, 9, 4, 3)
    half = [x.astype(np.float16) for x in (q, k, v)]
    out16 = linear_attention(*half, method=method, backend=backend)
    want = linear_attention(*(x.astype(np.float32) for x in half), method=method, backend=backend)
    assert out16.dtype == np.float16
    np.testing.assert_array_equal(out16, want.astype(np.float16))
    grads = linear_attention_backward(np.ones((9, 3), np.float16), *half, method=method,
                                      backend=backend)
    assert all(g.dtype == np.float16 for g in grads)


@pytest.mark.parametrize("method, backend", PATHS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lead, n", [((2,), 0), ((0,), 5)])   # no positions; no sequences
@pytest.mark.parametrize("name", FEATURE_MAP_NAMES)
def test_empty_inputs(method, backend, causal, lead, n, name):
    q, k, v = random_qkv(13, n, 3, 5, lead)
    kw = dict(causal=causal, method=method, backend=backend, feature_map=feature_map(name))
    out = linear_attention(q, k, v, **kw)
    assert out.shape == (*lead, n, 5)
    grads = linear_attention_backward(out, q, k, v, **kw)
    assert [g.shape for g in grads] == [(*lead, n, 3), (*lead, n, 3), (*lead, n, 5)]


@pytest.mark.parametrize("method, backend", PATHS)
def test_non_contiguous_views(method, backend):
    q, k, v = random_qkv(14, 10, 6, 8, (3,))
    views = q[::2, ::-1, ::2], k[::2, ::-1, ::2], v[::2, ::-1, 1::2]
    assert not views[0].flags.c_contiguous
    want = linear_attention(*(np.ascontiguousarray(x) for x in views), causal=True,
                            method="quadratic")
    got = linear_attention(*views, causal=True, method=method, backend=backend, chunk_size=3)
    np.testing.assert_allclose(got, want, rtol=1e-10)


@pytest.mark.parametrize("method, backend", PATHS)
@pytest.mark.parametrize("causal", [False, True])
def test_nan_query_row_poisons_only_its_row(method, backend, causal):
    q, k, v = random_qkv(15, 10, 3, 2)
    q[4, 0] = np.nan
    out = linear_attention(q, k, v, causal=causal, method=method, backend=backend,
                           chunk_size=3)
    assert np.all(np.isnan(out[4]))
    assert np.all(np.isfinite(np.delete(out, 4, axis=0)))


@pytest.mark.parametrize("method, backend", PATHS)
def test_nan_key_reaches_only_later_rows_when_causal(method, backend):
    q, k, v = random_qkv(16, 10, 3, 2)
    k[6, 1] = np.nan
    out = linear_attention(q, k, v, causal=True, method=method, backend=backend,
                           chunk_size=4)
    assert np.all(np.isfinite(out[:6])) and np.all(np.isnan(out[6:]))


@pytest.mark.parametrize("keyword, value, listed", [
    ("method", "fast", "quadratic, linear, chunked, recurrent"),
    ("backend", "torch", "numpy, numba, cupy"),
    ("feature_map", "elu", "elu\\+1, relu, taylor, favor"),
])
def test_unknown_names_list_the_valid_ones(keyword, value, listed):
    q, k, v = random_qkv(19, 4, 2, 2)
    with pytest.raises(ValueError, match=listed):
        linear_attention(q, k, v, **{keyword: value})


@pytest.mark.parametrize("keyword, value", [("eps", -1.0), ("eps", "x"), ("chunk_size", 0),
                                            ("chunk_size", 2.5)])
def test_bad_options(keyword, value):
    q, k, v = random_qkv(20, 4, 2, 2)
    with pytest.raises(ValueError, match=keyword):
        linear_attention(q, k, v, **{keyword: value})


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_default_chunk_size_is_each_backends_own(backend):
    # chunk_size=None hands no block length down: each kernel's measured default runs (for
    # Numba's, the one its BLAS kernel favours)
    from linattn.numba_cpu import chunked
    best = 32 if backend == "numpy" else chunked.default_chunk_size()
    q, k, v = random_qkv(21, 100, 64, 64)
    dout = np.random.default_rng(22).standard_normal(v.shape)
    kw = dict(causal=True, method="chunked", backend=backend)
    for chunk_size, same in ((best, True), (best // 2, False)):
        want = [linear_attention(q, k, v, chunk_size=chunk_size, **kw),
                *linear_attention_backward(dout, q, k, v, chunk_size=chunk_size, **kw)]
        got = [linear_attention(q, k, v, **kw), *linear_attention_backward(dout, q, k, v, **kw)]
        assert all(np.array_equal(g, w) for g, w in zip(got, want)) == same


@pytest.mark.parametrize("large, want", [(False, 16), (True, 32)])
def test_numbas_default_chunk_follows_the_blas_kernel(large, want, monkeypatch):
    from linattn.numba_cpu import chunked
    monkeypatch.setattr(chunked.blas_threads, "large_products", lambda: large)
    assert chunked.default_chunk_size() == want
    q, k, v = random_qkv(23, 70, 8, 8)
    kw = dict(causal=True, method="chunked", backend="numba")
    assert np.array_equal(linear_attention(q, k, v, **kw),
                          linear_attention(q, k, v, chunk_size=want, **kw))
    # the check can fail: chunks of 16 and of 32 give results that differ in their last bits
    # here, so the equality above tells the two apart
    assert not np.array_equal(linear_attention(q, k, v, chunk_size=16, **kw),
                              linear_attention(q, k, v, chunk_size=32, **kw))
