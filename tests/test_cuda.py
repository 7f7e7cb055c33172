"""The CuPy backend on a GPU: every method, the step and softmax attention agree with the NumPy
oracle (float64 to 1e-10, float32 to 1e-4 at N = 65536), gradients match finite differences,
and NaN, N = 0, dtypes and views behave as on the CPU. Skips cleanly without CuPy or a GPU
(``pytest -m gpu`` selects these)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from linattn import (Recurrence, State, linear_attention, linear_attention_backward,
                     linear_attention_step, softmax_attention, softmax_attention_backward)
from linattn.cuda import launch

from helpers import FEATURE_MAP_NAMES, assert_gradients_match, random_qkv, relative_error
from test_linear import feature_map

pytestmark = pytest.mark.gpu
CUDA_METHODS = ("linear", "chunked", "recurrent", "auto")        # v1, v2, v1, v2
leads = st.sampled_from([(), (2,), (2, 3)])


@pytest.fixture(scope="module")
def cp():
    """cupy, or a skip naming what is missing (no CuPy, no driver, no device)."""
    try:
        return launch.require_cupy()
    except (ImportError, RuntimeError, OSError) as err:
        pytest.skip(f"no GPU backend here: {err}")


def on_gpu(cp, *arrays):
    return [cp.asarray(a) for a in arrays]


@given(n=st.integers(1, 200), d=st.integers(1, 6), m=st.integers(1, 70), lead=leads,
       causal=st.booleans(), fmap=st.sampled_from(FEATURE_MAP_NAMES),
       method=st.sampled_from(CUDA_METHODS + ("quadratic",)), seed=st.integers(0, 2**32 - 1))
def test_methods_match_the_numpy_oracle(cp, n, d, m, lead, causal, fmap, method, seed):
    q, k, v = random_qkv(seed, n, d, m, lead)
    dout = np.random.default_rng(seed + 1).standard_normal(v.shape)
    kw = dict(causal=causal, feature_map=feature_map(fmap))
    out = linear_attention(*on_gpu(cp, q, k, v), method=method, backend="cupy", **kw)
    assert isinstance(out, cp.ndarray) and out.shape == v.shape
    want = linear_attention(q, k, v, method="quadratic", **kw)
    np.testing.assert_allclose(cp.asnumpy(out), want, rtol=1e-10, atol=1e-12)
    grads = linear_attention_backward(*on_gpu(cp, dout, q, k, v), method=method, **kw)
    for g, w in zip(grads, linear_attention_backward(dout, q, k, v, method="quadratic", **kw)):
        np.testing.assert_allclose(cp.asnumpy(g), w, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("n, d, m, fmap", [(129, 66, 65, "elu+1"), (64, 64, 64, "relu"),
                                           (130, 8, 3, "taylor")])   # taylor: F = 73
@pytest.mark.parametrize("method", ["linear", "chunked"])
def test_tile_edges_match_the_oracle(cp, method, n, d, m, fmap):
    # F and M past one 64-wide tile, chunks full and ragged
    q, k, v = random_qkv(n + d, n, d, m, (2,))
    dout = np.random.default_rng(n).standard_normal(v.shape)
    kw = dict(causal=True, feature_map=fmap)
    out = linear_attention(*on_gpu(cp, q, k, v), method=method, **kw)
    want = linear_attention(q, k, v, method="quadratic", **kw)
    np.testing.assert_allclose(cp.asnumpy(out), want, rtol=1e-10, atol=1e-12)
    grads = linear_attention_backward(*on_gpu(cp, dout, q, k, v), method=method, **kw)
    for g, w in zip(grads, linear_attention_backward(dout, q, k, v, method="quadratic", **kw)):
        np.testing.assert_allclose(cp.asnumpy(g), w, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("n, d, m", [(5, 2, 3), (70, 2, 2)])
@pytest.mark.parametrize("method", ["linear", "chunked"])
def test_backward_matches_finite_differences(cp, method, n, d, m):
    kw = dict(causal=True, method=method, backend="cupy")

    def forward(q, k, v):
        return cp.asnumpy(linear_attention(*on_gpu(cp, q, k, v), **kw))

    def backward(dout, q, k, v):
        return [cp.asnumpy(g) for g in linear_attention_backward(*on_gpu(cp, dout, q, k, v), **kw)]
    assert_gradients_match(forward, backward, random_qkv(n, n, d, m))


@pytest.mark.parametrize("method", ["linear", "chunked"])
def test_float32_close_to_float64_at_n65536(cp, method):
    q, k, v = random_qkv(10, 65536, 64, 64, (2,))
    dout = np.random.default_rng(11).standard_normal(v.shape)
    want = linear_attention(q, k, v, causal=True, method="chunked")
    args32 = on_gpu(cp, *(x.astype(np.float32) for x in (q, k, v)))
    out = linear_attention(*args32, causal=True, method=method)
    assert out.dtype == np.float32 and relative_error(cp.asnumpy(out), want) < 1e-4
    want = linear_attention_backward(dout, q, k, v, causal=True, method="chunked")
    grads = linear_attention_backward(cp.asarray(dout, np.float32), *args32, causal=True,
                                      method=method)
    for g, w in zip(grads, want):
        assert g.dtype == np.float32 and relative_error(cp.asnumpy(g), w) < 1e-4


@given(n=st.integers(1, 12), d=st.integers(1, 70), m=st.integers(1, 130), lead=leads,
       seed=st.integers(0, 2**32 - 1))
def test_step_matches_the_numpy_step(cp, n, d, m, lead, seed):
    q, k, v = random_qkv(seed, n, d, m, lead)
    state, want_state = None, None
    for i in range(n):
        out, state = linear_attention_step(*on_gpu(cp, q[..., i, :], k[..., i, :], v[..., i, :]),
                                           state, backend="cupy")
        want, want_state = linear_attention_step(q[..., i, :], k[..., i, :], v[..., i, :],
                                                 want_state)
        np.testing.assert_allclose(cp.asnumpy(out), want, rtol=1e-10, atol=1e-12)
    for g, w in zip(state, want_state):
        np.testing.assert_allclose(cp.asnumpy(g), w, rtol=1e-10)


def test_scanning_the_step_equals_causal_attention(cp):
    q, k, v = on_gpu(cp, *random_qkv(3, 80, 4, 3, (2,)))
    state, outs = None, []
    for i in range(80):
        out, state = linear_attention_step(q[:, i], k[:, i], v[:, i], state)
        outs.append(out)
    want = linear_attention(q, k, v, causal=True)
    np.testing.assert_allclose(cp.asnumpy(cp.stack(outs, axis=1)), cp.asnumpy(want), rtol=1e-10)


@given(n=st.integers(1, 12), d=st.integers(1, 70), m=st.integers(1, 130), lead=leads,
       fmap=st.sampled_from(FEATURE_MAP_NAMES), compensated=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_recurrence_matches_numpy(cp, n, d, m, lead, fmap, compensated, seed):
    q, k, v = random_qkv(seed, n, d, m, lead)
    kw = dict(dtype="float64", feature_map=feature_map(fmap), compensated=compensated)
    gpu, cpu = Recurrence(lead, d, m, backend="cupy", **kw), Recurrence(lead, d, m, **kw)
    for i in range(n):
        out = gpu.step(*on_gpu(cp, q[..., i, :], k[..., i, :], v[..., i, :]))
        assert isinstance(out, cp.ndarray) and out.shape == (*lead, m)
        want = cpu.step(q[..., i, :], k[..., i, :], v[..., i, :])
        np.testing.assert_allclose(cp.asnumpy(out), want, rtol=1e-10, atol=1e-12)
    for g, w in zip(gpu.state, cpu.state):
        np.testing.assert_allclose(cp.asnumpy(g), w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compensated_state_equals_numpy_bit_for_bit(cp, dtype):
    # relu features are exact on both sides, and every rounding of v2 is spelled out
    q, k, v = (x.astype(dtype) for x in random_qkv(21, 200, 70, 130, (2,)))
    kw = dict(dtype=dtype, feature_map="relu", compensated=True)
    gpu, cpu = Recurrence((2,), 70, 130, backend="cupy", **kw), Recurrence((2,), 70, 130, **kw)
    for i in range(200):
        gpu.step(*on_gpu(cp, q[:, i], k[:, i], v[:, i]))
        cpu.step(q[:, i], k[:, i], v[:, i])
    for g, w in zip(gpu.state, cpu.state):
        np.testing.assert_array_equal(cp.asnumpy(g), w)


def test_recurrence_on_the_gpu_takes_cupy_arrays(cp):
    rnn = Recurrence((2,), 3, 2, backend="cupy")
    q = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match="must be a cupy.ndarray"):
        rnn.step(q, q, np.ones((2, 2), np.float32))
    out = rnn.step(*on_gpu(cp, q, q, np.ones((2, 2), np.float32)))
    assert out.dtype == np.float32
    _, state = linear_attention_step(*on_gpu(cp, q, q, np.ones((2, 2), np.float32)),
                                     compensated=True)
    assert all(isinstance(a, cp.ndarray) for a in state) and len(state) == 4


@given(n=st.integers(1, 300), d=st.integers(1, 6), m=st.integers(1, 6), lead=leads,
       causal=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_softmax_matches_numpy(cp, n, d, m, lead, causal, seed):
    q, k, v = random_qkv(seed, n, d, m, lead)
    dout = np.random.default_rng(seed + 1).standard_normal(v.shape)
    out = softmax_attention(*on_gpu(cp, q, k, v), causal=causal, backend="cupy")
    np.testing.assert_allclose(cp.asnumpy(out), softmax_attention(q, k, v, causal=causal),
                               rtol=1e-10, atol=1e-12)
    grads = softmax_attention_backward(*on_gpu(cp, dout, q, k, v), causal=causal)
    for g, w in zip(grads, softmax_attention_backward(dout, q, k, v, causal=causal)):
        np.testing.assert_allclose(cp.asnumpy(g), w, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("method", CUDA_METHODS)
@pytest.mark.parametrize("causal", [False, True])
def test_nan_query_row_poisons_only_its_row(cp, method, causal):
    q, k, v = random_qkv(15, 100, 3, 2)
    q[70, 0] = np.nan
    out = cp.asnumpy(linear_attention(*on_gpu(cp, q, k, v), causal=causal, method=method))
    assert np.all(np.isnan(out[70])) and np.all(np.isfinite(np.delete(out, 70, axis=0)))


@pytest.mark.parametrize("method", CUDA_METHODS)
def test_nan_key_reaches_only_later_rows_when_causal(cp, method):
    q, k, v = random_qkv(16, 100, 3, 2)
    k[66, 1] = np.nan
    out = cp.asnumpy(linear_attention(*on_gpu(cp, q, k, v), causal=True, method=method))
    assert np.all(np.isfinite(out[:66])) and np.all(np.isnan(out[66:]))


@pytest.mark.parametrize("lead, n", [((2,), 0), ((0,), 5)])
@pytest.mark.parametrize("method", CUDA_METHODS)
@pytest.mark.parametrize("causal", [False, True])
def test_empty_inputs(cp, method, causal, lead, n):
    q, k, v = on_gpu(cp, *random_qkv(13, n, 3, 5, lead))
    out = linear_attention(q, k, v, causal=causal, method=method)
    assert out.shape == (*lead, n, 5)
    grads = linear_attention_backward(out, q, k, v, causal=causal, method=method)
    assert [g.shape for g in grads] == [(*lead, n, 3), (*lead, n, 3), (*lead, n, 5)]
    assert softmax_attention(q, k, v, causal=causal).shape == (*lead, n, 5)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_dtypes_are_kept(cp, dtype):
    q, k, v = on_gpu(cp, *(x.astype(dtype) for x in random_qkv(12, 70, 4, 3)))
    assert linear_attention(q, k, v, causal=True).dtype == dtype
    assert all(g.dtype == dtype for g in linear_attention_backward(v, q, k, v, causal=True))
    assert softmax_attention(q, k, v, causal=True).dtype == dtype
    out, state = linear_attention_step(q[0], k[0], v[0])
    assert out.dtype == dtype and state.S.dtype == np.float32


@pytest.mark.parametrize("method", CUDA_METHODS)
def test_non_contiguous_views(cp, method):
    q, k, v = random_qkv(14, 130, 6, 8, (3,))
    views = [x[::2, ::-1, ::2] for x in on_gpu(cp, q, k, v)]
    want = linear_attention(q[::2, ::-1, ::2], k[::2, ::-1, ::2], v[::2, ::-1, ::2],
                            causal=True, method="quadratic")
    got = linear_attention(*views, causal=True, method=method)
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-10)


def test_mixed_arrays_are_type_errors(cp):
    q, k, v = random_qkv(17, 4, 2, 2)
    with pytest.raises(TypeError, match="NumPy or all CuPy"):
        linear_attention(cp.asarray(q), k, v)
    with pytest.raises(TypeError, match="state must hold cupy arrays"):
        linear_attention_step(*on_gpu(cp, q[0], k[0], v[0]), State(np.zeros((2, 2)), np.zeros(2)))


@given(n_q=st.integers(1, 70), n_k=st.integers(1, 70), lead=leads,
       seed=st.integers(0, 2**32 - 1))
def test_cross_attention_matches_numpy(cp, n_q, n_k, lead, seed):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((*lead, n_q, 4)), rng.standard_normal((*lead, n_k, 4))
    v, dout = rng.standard_normal((*lead, n_k, 3)), rng.standard_normal((*lead, n_q, 3))
    for f, f_backward in ((softmax_attention, softmax_attention_backward),
                          (linear_attention, linear_attention_backward)):
        out = f(*on_gpu(cp, q, k, v), backend="cupy")
        np.testing.assert_allclose(cp.asnumpy(out), f(q, k, v, backend="numpy"), rtol=1e-10,
                                   atol=1e-12)
        grads = f_backward(*on_gpu(cp, dout, q, k, v), backend="cupy")
        for g, w in zip(grads, f_backward(dout, q, k, v, backend="numpy")):
            np.testing.assert_allclose(cp.asnumpy(g), w, rtol=1e-10, atol=1e-11)
