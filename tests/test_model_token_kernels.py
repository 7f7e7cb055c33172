"""The generation kernels (``linattn.model.fast.token_kernels``) against the NumPy layers and
``softmax_attention``: float64 within rounding on drawn shapes, float32 close, and the
edge values (NaN, infinities, large logits) handled as the references handle them."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from linattn import softmax_attention
from linattn.model.layers import gelu, layer_norm, relu
from linattn.model.fast import token_kernels as kernels


def _normal(rng, shape, dtype=np.float64, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


# the kernels take a token's arrays as columns, (features, B): the references see them
# transposed, (B, features)


@given(b=st.integers(1, 17), d=st.integers(1, 70), seed=st.integers(0, 2**32 - 1))
def test_add_norm_is_the_residual_add_then_layer_norm(b, d, seed):
    rng = np.random.default_rng(seed)
    x, y = _normal(rng, (d, b), scale=3), _normal(rng, (d, b))
    bias, g, beta = _normal(rng, d), _normal(rng, d), _normal(rng, d)
    want_x = x + (y + bias[:, None])
    want_h = layer_norm(want_x.T, g, beta).T
    h = np.empty_like(x)
    kernels.add_norm(x, y, bias, g, beta, h)
    np.testing.assert_allclose(x, want_x, rtol=1e-15, atol=0)
    np.testing.assert_allclose(h, want_h, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("activation, reference", [(False, gelu), (True, relu)])
@given(b=st.integers(1, 17), f=st.integers(1, 70), seed=st.integers(0, 2**32 - 1))
def test_bias_activate_is_the_layers_activation(activation, reference, b, f, seed):
    rng = np.random.default_rng(seed)
    u, bias = _normal(rng, (f, b), scale=4), _normal(rng, f)
    want = reference(u + bias[:, None])
    kernels.bias_activate(u, bias, activation)
    np.testing.assert_allclose(u, want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("activation", [False, True])
@given(b=st.integers(2, 40), f=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_bias_activate_columns_at_once_are_each_column_alone(dtype, activation, b, f, seed):
    # the batch's flat loop against the one-column loop, bit for bit: the same operations
    rng = np.random.default_rng(seed)
    u, bias = _normal(rng, (f, b), dtype, scale=4), _normal(rng, f, dtype)
    columns = [np.ascontiguousarray(u[:, [j]]) for j in range(b)]
    kernels.bias_activate(u, bias, activation)
    for j, col in enumerate(columns):
        kernels.bias_activate(col, bias, activation)
        np.testing.assert_array_equal(u[:, [j]].view(np.uint8), col.view(np.uint8))


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 3e-6)])
@pytest.mark.parametrize("activation, reference", [(False, gelu), (True, relu)])
@pytest.mark.parametrize("shape", [(15, 1), (5, 3)])        # one column; the flat loop
def test_bias_activate_edge_values(dtype, rtol, activation, reference, shape):
    # GELU's sigmoid form never overflows: exp only sees -|2 y|; NaN stays NaN. The float64
    # reference: in float32 the tanh form loses digits to 1 + tanh(y) for negative x
    u = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 3.0, -3.0, 30.0,
                  -30.0, 1e4, -1e4, 1e30, -1e30], dtype=dtype).reshape(shape)
    with np.errstate(invalid="ignore", over="ignore"):
        want = reference(u.astype(np.float64))
        kernels.bias_activate(u, np.zeros(u.shape[0], dtype), activation)
    assert u.dtype == dtype
    np.testing.assert_allclose(u, want, rtol=rtol, atol=0)


def _cache(rng, b, h, d_head, n_max, dtype):
    """A random cache (keys stored transposed) and q | k | v columns (3 D, B) for the next
    position."""
    keys = _normal(rng, (b, h, n_max, d_head), dtype)
    values = _normal(rng, (b, h, n_max, d_head), dtype)
    qkv = _normal(rng, (3 * h * d_head, b), dtype, scale=2)
    return qkv, np.ascontiguousarray(keys.transpose(0, 1, 3, 2)), values


def _attend_reference(qkv, t, keys_t, values):
    """softmax_attention of the new query over the cache with k_t, v_t put at t: (D, B)."""
    b, h, d_head, _ = keys_t.shape
    q, k, v = (x.T.reshape(b, h, 1, d_head) for x in np.split(qkv, 3))
    keys = keys_t.transpose(0, 1, 3, 2)[:, :, :t + 1].copy()
    vals = values[:, :, :t + 1].copy()
    keys[:, :, t], vals[:, :, t] = k[:, :, 0], v[:, :, 0]
    return softmax_attention(q, keys, vals, backend="numpy").reshape(b, h * d_head).T


@given(b=st.integers(1, 3), h=st.integers(1, 3), d_head=st.integers(1, 9),
       t=st.integers(0, 40), extra=st.integers(0, 3), seed=st.integers(0, 2**32 - 1))
def test_cache_attend_is_softmax_attention_of_one_query(b, h, d_head, t, extra, seed):
    rng = np.random.default_rng(seed)
    qkv, keys_t, values = _cache(rng, b, h, d_head, t + 1 + extra, np.float64)
    want = _attend_reference(qkv, t, keys_t, values)
    heads, scores = np.empty((h * d_head, b)), np.empty(t + 1 + extra)
    kernels.cache_attend(qkv, t, keys_t, values, d_head ** -0.5, scores, heads)
    np.testing.assert_allclose(heads, want, rtol=1e-10, atol=1e-12)
    # the new key and value now sit at position t of the cache
    k, v = (x.T.reshape(b, h, d_head) for x in np.split(qkv, 3)[1:])
    np.testing.assert_array_equal(keys_t[:, :, :, t], k)
    np.testing.assert_array_equal(values[:, :, t], v)


@pytest.mark.parametrize("t", [0, 63, 700])
def test_cache_attend_float32_and_large_logits(t):
    rng = np.random.default_rng(t)
    qkv, keys_t, values = _cache(rng, 2, 4, 32, 784, np.float32)
    qkv[:128] *= 400                           # logits in the thousands: exp must not overflow
    want = _attend_reference(qkv.astype(np.float64), t, keys_t.astype(np.float64),
                             values.astype(np.float64))
    heads, scores = np.empty((128, 2), np.float32), np.empty(784, np.float32)
    kernels.cache_attend(qkv, t, keys_t, values, np.float32(32 ** -0.5), scores, heads)
    assert heads.dtype == np.float32 and np.isfinite(heads).all()
    np.testing.assert_allclose(heads, want, rtol=2e-4, atol=2e-5)


def test_cache_attend_nan_in_a_query_gives_nan_in_its_head_only():
    rng = np.random.default_rng(0)
    qkv, keys_t, values = _cache(rng, 1, 2, 4, 6, np.float64)
    qkv[1, 0] = np.nan                          # head 0's query
    heads, scores = np.empty((8, 1)), np.empty(6)
    kernels.cache_attend(qkv, 3, keys_t, values, 0.5, scores, heads)
    assert np.isnan(heads[:4]).all() and np.isfinite(heads[4:]).all()


@given(n=st.integers(1, 40), k=st.integers(0, 40), b=st.integers(1, 3),
       transposed=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_product_is_the_matrix_product(n, k, b, transposed, seed):
    """``product``: one column row by row on Numba's threads (fewer rows than threads: an
    empty block), more by one BLAS call; x given as a transposed (F-ordered) array; an
    empty sum (k = 0) is 0."""
    rng = np.random.default_rng(seed)
    w = _normal(rng, (n, k))
    x = _normal(rng, (b, k)).T if transposed else _normal(rng, (k, b))
    out = np.full((n, b), np.nan)                # every entry is written
    kernels.product(w, x, out)
    np.testing.assert_allclose(out, w @ x, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_column_does_not_depend_on_the_thread_count(dtype):
    import numba
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one Numba thread: nothing to compare")
    rng = np.random.default_rng(5)
    w, x = _normal(rng, (257, 300), dtype), _normal(rng, (300, 1), dtype)
    one, two = np.empty((257, 1), dtype), np.empty((257, 1), dtype)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        kernels.product(w, x, one)
        numba.set_num_threads(2)
        kernels.product(w, x, two)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(one.view(np.uint8), two.view(np.uint8))


def test_product_in_float32_and_nan():
    rng = np.random.default_rng(3)
    w, x = _normal(rng, (1024, 256), np.float32), _normal(rng, (256, 1), np.float32)
    x[5] = np.nan
    out = np.empty((1024, 1), np.float32)
    kernels.product(w, x, out)
    assert out.dtype == np.float32 and np.isnan(out).all()
    x[5] = 0
    kernels.product(w, x, out)
    np.testing.assert_allclose(out, (w.astype(np.float64) @ x), rtol=1e-4, atol=1e-4)
