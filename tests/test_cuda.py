"""The CuPy backend on a GPU: every method, the step and softmax attention agree with the NumPy
oracle within ``TOLERANCE`` (float64, float32, float16 values), gradients match finite
differences, the compensated step's state equals NumPy's bit for bit (with float32 subnormals
flushed, as CuPy compiles), arrays past 2^31 elements are indexed in 64 bits, and NaN, N = 0,
dtypes, views and a non-default stream behave as on the CPU. The CPU references run on the
NumPy backend (``backend="numpy"``: nothing compiles with Numba). Skips cleanly without CuPy or
a GPU (``pytest tests/test_cuda.py -m gpu`` selects these)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from linattn import (Favor, Recurrence, State, linear_attention, linear_attention_backward,
                     linear_attention_step, softmax_attention, softmax_attention_backward)
from linattn.cuda import launch

from helpers import FEATURE_MAP_NAMES, assert_gradients_match, random_qkv, relative_error

pytestmark = pytest.mark.gpu
CUDA_METHODS = ("linear", "chunked", "recurrent", "auto")        # v1, v2, v1, v2
leads = st.sampled_from([(), (2,), (2, 3)])

# What a GPU result may differ from the NumPy oracle by, by the result's dtype (the table in
# linattn/lab/gpu_notes.md): |got - want| <= rtol |want| + floor max|want|.
# - float64: the GPU contracts a * b + c into one fma (one rounding where NumPy rounds twice)
#   and sums in another order (tiles, warp shuffles), a few ulps of the summed terms; where
#   terms cancel (S + k v^T, dP - rowsum(dP P), signed values) that exceeds any rtol of the
#   result, so the floor bounds it, relative to the terms' scale: the array's largest entry,
#   or 1 (the inputs are of order 1) where the whole array is a residue of cancellation;
# - float32: the same, against a float64 oracle on the same float32 inputs, so float32's own
#   rounding (6e-8 an operation, growing with the sums); -ftz=true flushes results below
#   1.2e-38 to zero, far under the floor;
# - float16 values in, float32 arithmetic, float16 out: the final rounding to float16,
#   2^-11 = 4.9e-4 relative, dominates.
TOLERANCE = {"float64": (1e-10, 1e-11), "float32": (1e-5, 1e-6), "float16": (2e-3, 1e-3)}


def assert_close(got, want, dtype=None):
    """``got`` (NumPy) within TOLERANCE[dtype or got's dtype] of ``want``, inputs of order 1."""
    rtol, floor = TOLERANCE[np.dtype(dtype or got.dtype).name]
    scale = np.max(np.abs(want), initial=1.0)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=floor * scale)


def flush(x):
    """x with float32 subnormals replaced by a zero of their sign: CUDA's -ftz=true."""
    return np.where(np.abs(x) < np.finfo(np.float32).tiny, x * 0, x).astype(x.dtype)


def kahan_add_flushed_(total, lost, term):
    """forms.recurrent.kahan_add_ as the GPU runs it under -ftz=true: every operand and every
    result of the four float32 operations flushed (the oracle of the float32 compensated step
    where subnormals occur)."""
    y = flush(flush(term) - flush(lost))
    t = flush(flush(total) + y)
    lost[...] = flush(flush(t - flush(total)) - y)
    total[...] = t


def feature_map(name):
    return Favor(n_features=5, seed=1) if name == "favor" else name


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
    want = linear_attention(q, k, v, method="quadratic", backend="numpy", **kw)
    assert_close(cp.asnumpy(out), want)
    grads = linear_attention_backward(*on_gpu(cp, dout, q, k, v), method=method, **kw)
    wants = linear_attention_backward(dout, q, k, v, method="quadratic", backend="numpy", **kw)
    for g, w in zip(grads, wants):
        assert_close(cp.asnumpy(g), w)


@pytest.mark.parametrize("n, d, m, fmap", [(129, 66, 65, "elu+1"), (64, 64, 64, "relu"),
                                           (130, 8, 3, "taylor"),    # taylor: F = 73
                                           (200, 128, 128, "relu")])  # two full tiles
@pytest.mark.parametrize("method", ["linear", "chunked"])
def test_tile_edges_match_the_oracle(cp, method, n, d, m, fmap):
    # F and M past one 64-wide tile, chunks full and ragged
    q, k, v = random_qkv(n + d, n, d, m, (2,))
    dout = np.random.default_rng(n).standard_normal(v.shape)
    kw = dict(causal=True, feature_map=fmap)
    out = linear_attention(*on_gpu(cp, q, k, v), method=method, **kw)
    assert_close(cp.asnumpy(out), linear_attention(q, k, v, method="quadratic",
                                                   backend="numpy", **kw))
    grads = linear_attention_backward(*on_gpu(cp, dout, q, k, v), method=method, **kw)
    wants = linear_attention_backward(dout, q, k, v, method="quadratic", backend="numpy", **kw)
    for g, w in zip(grads, wants):
        assert_close(cp.asnumpy(g), w)


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
    # float32 sums over 65536 positions, to float32's accuracy: 1e-4 of the largest entry
    q, k, v = random_qkv(10, 65536, 64, 64, (2,))
    dout = np.random.default_rng(11).standard_normal(v.shape)
    want = linear_attention(q, k, v, causal=True, method="chunked", backend="numpy")
    args32 = on_gpu(cp, *(x.astype(np.float32) for x in (q, k, v)))
    out = linear_attention(*args32, causal=True, method=method)
    assert out.dtype == np.float32 and relative_error(cp.asnumpy(out), want) < 1e-4
    want = linear_attention_backward(dout, q, k, v, causal=True, method="chunked",
                                     backend="numpy")
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
                                                 want_state, backend="numpy")
        assert_close(cp.asnumpy(out), want)
    for g, w in zip(state, want_state):          # S = S + k v^T, one fma: entries cancel
        assert_close(cp.asnumpy(g), w)


def test_scanning_the_step_equals_causal_attention(cp):
    q, k, v = on_gpu(cp, *random_qkv(3, 80, 4, 3, (2,)))
    state, outs = None, []
    for i in range(80):
        out, state = linear_attention_step(q[:, i], k[:, i], v[:, i], state)
        outs.append(out)
    want = linear_attention(q, k, v, causal=True)
    assert_close(cp.asnumpy(cp.stack(outs, axis=1)), cp.asnumpy(want))


@given(n=st.integers(1, 12), d=st.integers(1, 70), m=st.integers(1, 130), lead=leads,
       fmap=st.sampled_from(FEATURE_MAP_NAMES), compensated=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_recurrence_matches_numpy(cp, n, d, m, lead, fmap, compensated, seed):
    q, k, v = random_qkv(seed, n, d, m, lead)
    kw = dict(dtype="float64", feature_map=feature_map(fmap), compensated=compensated)
    gpu = Recurrence(lead, d, m, backend="cupy", **kw)
    cpu = Recurrence(lead, d, m, backend="numpy", **kw)
    for i in range(n):
        out = gpu.step(*on_gpu(cp, q[..., i, :], k[..., i, :], v[..., i, :]))
        assert isinstance(out, cp.ndarray) and out.shape == (*lead, m)
        want = cpu.step(q[..., i, :], k[..., i, :], v[..., i, :])
        assert_close(cp.asnumpy(out), want)
    for g, w in zip(gpu.state, cpu.state):       # features from CuPy's exp: not bit for bit
        assert_close(cp.asnumpy(g), w)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compensated_state_equals_numpy_bit_for_bit(cp, dtype):
    # relu features are exact on both sides, every operation of v2 is an explicitly rounded
    # intrinsic (never contracted), and no value is subnormal: bit for bit
    q, k, v = (x.astype(dtype) for x in random_qkv(21, 200, 70, 130, (2,)))
    kw = dict(dtype=dtype, feature_map="relu", compensated=True)
    gpu = Recurrence((2,), 70, 130, backend="cupy", **kw)
    cpu = Recurrence((2,), 70, 130, backend="numpy", **kw)
    for i in range(200):
        gpu.step(*on_gpu(cp, q[:, i], k[:, i], v[:, i]))
        cpu.step(q[:, i], k[:, i], v[:, i])
    for g, w in zip(gpu.state, cpu.state):
        np.testing.assert_array_equal(cp.asnumpy(g), w)


def subnormal_steps(seed, steps=20, f=70, m=130):
    """Positive features and values of scale 2^-64: products k v near float32's smallest
    normal 2^-126, half of them subnormal, sums growing past it."""
    rng = np.random.default_rng(seed)
    k = (np.abs(rng.standard_normal((steps, 2, f))) * 2.0**-64).astype(np.float32)
    v = (rng.standard_normal((steps, 2, m)) * 2.0**-64).astype(np.float32)
    return np.ones((2, f), np.float32), k, v


def test_compensated_float32_state_flushes_subnormals(cp):
    # CuPy compiles with -ftz=true: __fmul_rn and the others become mul.rn.ftz.f32 ... and
    # flush subnormal operands and results; the state equals NumPy's Kahan sums flushed so
    from linattn.cuda import step
    q, k, v = subnormal_steps(30)
    S, S_c = (np.zeros((2, 70, 130), np.float32) for _ in range(2))
    z, z_c = (np.zeros((2, 70), np.float32) for _ in range(2))
    gpu = on_gpu(cp, S, z, S_c, z_c)
    out = cp.empty((2, 130), cp.float32)
    for i in range(len(k)):
        step.step_into_compensated(*on_gpu(cp, q, k[i], v[i]), *gpu, out, np.float32(1e-6))
        kahan_add_flushed_(S, S_c, k[i][..., :, None] * v[i][..., None, :])
        kahan_add_flushed_(z, z_c, k[i])
    for g, w in zip(gpu, (S, z, S_c, z_c)):
        np.testing.assert_array_equal(cp.asnumpy(g), w)
    assert np.any(np.abs(k[0][..., :, None] * v[0][..., None, :]) < np.finfo(np.float32).tiny)


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
    assert_close(cp.asnumpy(out), softmax_attention(q, k, v, causal=causal, backend="numpy"))
    grads = softmax_attention_backward(*on_gpu(cp, dout, q, k, v), causal=causal)
    wants = softmax_attention_backward(dout, q, k, v, causal=causal, backend="numpy")
    for g, w in zip(grads, wants):
        assert_close(cp.asnumpy(g), w)


@pytest.mark.parametrize("causal", [False, True])
def test_softmax_lse_on_cupy_arrays(cp, causal):
    """return_lse and the backward's out=, lse= take CuPy arrays (NumPy's form, run by CuPy):
    CuPy arrays out, the NumPy oracle's values, and the same gradients as without them."""
    q, k, v = random_qkv(3, 37, 4, 5, (2,))
    dout = np.random.default_rng(4).standard_normal(v.shape)
    out, lse = softmax_attention(*on_gpu(cp, q, k, v), causal=causal, return_lse=True)
    want_out, want_lse = softmax_attention(q, k, v, causal=causal, backend="numpy",
                                           return_lse=True)
    assert isinstance(out, cp.ndarray) and isinstance(lse, cp.ndarray)
    assert_close(cp.asnumpy(out), want_out)
    assert_close(cp.asnumpy(lse), want_lse)
    grads = softmax_attention_backward(*on_gpu(cp, dout, q, k, v), causal=causal, out=out,
                                       lse=lse)
    wants = softmax_attention_backward(dout, q, k, v, causal=causal, backend="numpy")
    for g, w in zip(grads, wants):
        assert isinstance(g, cp.ndarray)
        assert_close(cp.asnumpy(g), w)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_low_precision_values_close_to_float64(cp, dtype):
    # the same low-precision inputs on both sides: the oracle in float64, the GPU in float32
    # (float16 values computed in float32, rounded back to float16 at the end)
    q, k, v = (x.astype(dtype) for x in random_qkv(19, 150, 8, 70, (2,)))
    dout = np.random.default_rng(20).standard_normal(v.shape).astype(dtype)
    wide = [x.astype(np.float64) for x in (dout, q, k, v)]
    gpu = on_gpu(cp, dout, q, k, v)
    for causal in (False, True):
        for method in CUDA_METHODS:
            out = linear_attention(*gpu[1:], causal=causal, method=method)
            want = linear_attention(*wide[1:], causal=causal, backend="numpy")
            assert_close(cp.asnumpy(out), want, dtype)
            grads = linear_attention_backward(*gpu, causal=causal, method=method)
            for g, w in zip(grads, linear_attention_backward(*wide, causal=causal,
                                                             backend="numpy")):
                assert g.dtype == dtype and relative_error(cp.asnumpy(g), w) < 4e-3
        out = softmax_attention(*gpu[1:], causal=causal)
        assert_close(cp.asnumpy(out), softmax_attention(*wide[1:], causal=causal,
                                                        backend="numpy"), dtype)
        grads = softmax_attention_backward(*gpu, causal=causal)
        for g, w in zip(grads, softmax_attention_backward(*wide, causal=causal,
                                                          backend="numpy")):
            assert g.dtype == dtype and relative_error(cp.asnumpy(g), w) < 4e-3
    state, want_state = None, None
    for i in range(20):                          # the step: a float32 state either way
        out, state = linear_attention_step(gpu[1][:, i], gpu[2][:, i], gpu[3][:, i], state)
        want, want_state = linear_attention_step(*(x[:, i] for x in wide[1:]), want_state,
                                                 backend="numpy")
        assert out.dtype == dtype and state.S.dtype == np.float32
        assert_close(cp.asnumpy(out), want, dtype)
    for g, w in zip(state, want_state):
        assert_close(cp.asnumpy(g), w, np.float32)


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


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_padding_and_states_on_the_gpu(cp, dtype):
    """Key padding (NaN in the padded rows) and states handed in and out, through the public
    functions on CuPy arrays (causal: the chunked kernels), against the NumPy backend; and
    key padding without the causal mask, and softmax's (NumPy's forms on CuPy arrays)."""
    from linattn import dispatch
    assert dispatch.kernel("linear", "auto", "auto", cp, True, (130, 3),
                           needs=dispatch.needed(causal=True, key_mask=True, initial_state=True,
                                                 return_state=True))[0].__name__ \
        == "linattn.cuda.chunked"
    rng = np.random.default_rng(31)
    q, k, v = (x.astype(dtype) for x in random_qkv(32, 130, 3, 5, (2,)))
    mask = rng.random((2, 130)) < 0.7
    mask[:, 0] = True
    k, v = np.where(mask[..., None], k, np.nan), np.where(mask[..., None], v, np.nan)
    state = State(rng.standard_normal((2, 3, 5)).astype(dtype),
                  (rng.random((2, 3)) + 0.5).astype(dtype))
    dstate = State(*(rng.standard_normal(x.shape).astype(dtype) for x in state))
    dout = rng.standard_normal(v.shape).astype(dtype)
    g = on_gpu(cp, q, k, v, dout, mask)
    gstate, gdstate = (State(*on_gpu(cp, *s)) for s in (state, dstate))
    kw = dict(causal=True, return_state=True)
    out, final = linear_attention(*g[:3], key_mask=g[4], initial_state=gstate, **kw)
    # the reference in float64 on the same values
    q, k, v, dout = (x.astype(np.float64) for x in (q, k, v, dout))
    state, dstate = (State(*(x.astype(np.float64) for x in s)) for s in (state, dstate))
    want, want_final = linear_attention(q, k, v, key_mask=mask, initial_state=state,
                                        backend="numpy", **kw)
    for got, w in zip((out, *final), (want, *want_final)):
        assert_close(cp.asnumpy(got), w, dtype)
    grads = linear_attention_backward(g[3], *g[:3], causal=True, key_mask=g[4],
                                      initial_state=gstate, dstate=gdstate)
    wants = linear_attention_backward(dout, q, k, v, causal=True, key_mask=mask,
                                      initial_state=state, dstate=dstate, backend="numpy")
    assert np.all(cp.asnumpy(grads[1])[~mask] == 0) and np.all(cp.asnumpy(grads[2])[~mask] == 0)
    for got, w in zip((*grads[:3], *grads[3]), (*wants[:3], *wants[3])):
        assert_close(cp.asnumpy(got), w, dtype)
    for causal in (True, False):      # non-causal: NumPy's forms on the CuPy arrays
        soft = softmax_attention(*g[:3], causal=causal, key_mask=g[4])
        assert_close(cp.asnumpy(soft), softmax_attention(q, k, v, causal=causal, key_mask=mask,
                                                         backend="numpy"), dtype)
    out = linear_attention(*g[:3], key_mask=g[4])
    assert_close(cp.asnumpy(out), linear_attention(q, k, v, key_mask=mask, backend="numpy"),
                 dtype)
    grads = linear_attention_backward(g[3], *g[:3], key_mask=g[4])
    assert np.all(cp.asnumpy(grads[1])[~mask] == 0) and np.all(cp.asnumpy(grads[2])[~mask] == 0)
    for got, w in zip(grads, linear_attention_backward(dout, q, k, v, key_mask=mask,
                                                       backend="numpy")):
        assert_close(cp.asnumpy(got), w, dtype)


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


def views(*arrays):
    """Strided, reversed views: (3, 130, w) -> (2, 130, ceil(w / 2))."""
    return [x[::2, ::-1, ::2] for x in arrays]


@pytest.mark.parametrize("method", CUDA_METHODS)
def test_non_contiguous_views(cp, method):
    q, k, v = random_qkv(14, 130, 6, 8, (3,))
    want = linear_attention(*views(q, k, v), causal=True, method="quadratic", backend="numpy")
    got = linear_attention(*views(*on_gpu(cp, q, k, v)), causal=True, method=method)
    assert_close(cp.asnumpy(got), want)


def test_non_contiguous_views_in_softmax_and_the_step(cp):
    q, k, v = random_qkv(22, 130, 6, 8, (3,))
    dout = np.random.default_rng(23).standard_normal(v.shape)
    gq, gk, gv, gdout = views(*on_gpu(cp, q, k, v, dout))
    q, k, v, dout = views(q, k, v, dout)
    assert_close(cp.asnumpy(softmax_attention(gq, gk, gv, causal=True)),
                 softmax_attention(q, k, v, causal=True, backend="numpy"))
    for g, w in zip(softmax_attention_backward(gdout, gq, gk, gv, causal=True),
                    softmax_attention_backward(dout, q, k, v, causal=True, backend="numpy")):
        assert_close(cp.asnumpy(g), w)
    state, want_state = None, None
    for i in range(0, 130, 7):                   # (2, 3) and (2, 4) columns of strided rows
        out, state = linear_attention_step(gq[:, i], gk[:, i], gv[:, i], state)
        want, want_state = linear_attention_step(q[:, i], k[:, i], v[:, i], want_state,
                                                 backend="numpy")
        assert_close(cp.asnumpy(out), want)
    rnn = Recurrence((2,), 3, 4, backend="cupy", dtype="float64")
    assert_close(cp.asnumpy(rnn.step(gq[:, 0], gk[:, 0], gv[:, 0])),
                 linear_attention_step(q[:, 0], k[:, 0], v[:, 0], backend="numpy")[0])


def test_a_non_default_stream(cp):
    # the inputs are written on a non-blocking stream after a long product; a kernel launched
    # on any other stream would read them before they are written
    q, k, v = random_qkv(24, 300, 6, 8, (2,))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        big = cp.ones((6000, 6000))
        busy = (big @ big)[0, 0] * 0                 # tens of milliseconds of work
        gq, gk, gv = (cp.asarray(x) + busy for x in (q, k, v))
        outs = [linear_attention(gq, gk, gv, causal=True, method=method)
                for method in ("linear", "chunked")]
        outs.append(softmax_attention(gq, gk, gv, causal=True))
        rnn = Recurrence((2,), 6, 8, backend="cupy", dtype="float64", compensated=True)
        outs.append(rnn.step(gq[:, -1], gk[:, -1], gv[:, -1]))
        host = [cp.asnumpy(x, stream=stream) for x in outs]
    stream.synchronize()
    want = linear_attention(q, k, v, causal=True, backend="numpy")
    assert_close(host[0], want)
    assert_close(host[1], want)
    assert_close(host[2], softmax_attention(q, k, v, causal=True, backend="numpy"))
    assert_close(host[3], linear_attention_step(q[:, -1], k[:, -1], v[:, -1],
                                                backend="numpy")[0])


ROWS_PAST_2_31 = 2**31 // 64 + 2**12       # rows of 64 entries: 2^31 + 2^18 entries in all


@pytest.mark.parametrize("case", ["chunked", "chunked backward", "softmax", "step"])
def test_arrays_past_2_31_elements(cp, case):
    # light work on float32 arrays of more than 2^31 entries: a 32-bit offset would wrap and
    # read the wrong rows (or fault); the heads or sequences at the far end are checked
    from linattn.cuda import chunked, softmax, step
    if cp.cuda.Device().mem_info[1] < 100 * 2**30:
        pytest.skip("needs a GPU with 100 GiB of memory")
    rng, n = cp.random.default_rng(0), 4096

    def normal(*shape, positive=False):
        x = rng.standard_normal(shape, dtype=cp.float32)
        return cp.abs(x, out=x) if positive else x
    check = (0, -1)                              # the first and the last head or sequence
    if case.startswith("chunked"):               # (H, N, 64): 2^31 + 2^18 entries
        f = 64 if case == "chunked" else 4       # backward: v, dout, out, dv past 2^31
        h = ROWS_PAST_2_31 // n
        q, k, v = normal(h, n, f, positive=True), normal(h, n, f, positive=True), normal(h, n, 64)
        host = [cp.asnumpy(x[check, :]).astype(np.float64) for x in (q, k, v)]
        if case == "chunked":
            got = [chunked.attend(q, k, v, causal=True, eps=1e-6)[check, :]]
            wants = [linear_attention(*host, causal=True, feature_map="relu", backend="numpy")]
        else:
            dout = normal(h, n, 64)
            got = chunked.attend_backward(dout, q, k, v, causal=True, eps=1e-6)
            got = [g[check, :] for g in got]
            wants = linear_attention_backward(cp.asnumpy(dout[check, :]), *host, causal=True,
                                              feature_map="relu", backend="numpy")
    elif case == "softmax":                      # P (H, N, N): H N N = 2^31 + 2^24
        q, k, v = (normal(129, n, 16) for _ in range(3))
        host = [cp.asnumpy(x[check, :]).astype(np.float64) for x in (q, k, v)]
        got = [softmax.attend(q, k, v, causal=True, scale=0.25)[check, :]]
        wants = [softmax_attention(*host, causal=True, backend="numpy")]
    else:                                        # S (B, 64, 64): 2^31 + 2^18 entries
        b = ROWS_PAST_2_31 // 64
        q, k, v = normal(b, 64, positive=True), normal(b, 64, positive=True), normal(b, 64)
        state = State(normal(b, 64, 64), normal(b, 64, positive=True))
        host = [cp.asnumpy(x[check, :]).astype(np.float64) for x in (q, k, v, *state)]
        out, new = step.step(q, k, v, state, 1e-6)
        got = [out[check, :], new.S[check, :], new.z[check, :]]
        want, want_state = linear_attention_step(*host[:3], State(*host[3:]),
                                                 feature_map="relu", backend="numpy")
        wants = [want, *want_state]
    for g, w in zip(got, wants):
        assert_close(cp.asnumpy(g), w, np.float32)
    del q, k, v
    cp.get_default_memory_pool().free_all_blocks()


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
        assert_close(cp.asnumpy(out), f(q, k, v, backend="numpy"))
        grads = f_backward(*on_gpu(cp, dout, q, k, v), backend="cupy")
        for g, w in zip(grads, f_backward(dout, q, k, v, backend="numpy")):
            assert_close(cp.asnumpy(g), w)
