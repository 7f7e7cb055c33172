"""The lean path's compiled layers (``linattn.model.fast.fused``) against the NumPy layers they
replace (``linattn.model.layers``, float64, odd sizes, one row), their backward passes
against central finite differences, float32, NaN and large inputs."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from linattn.model import layers
from linattn.model.fast import fused
from linattn.model.fast import optim as fast_optim

from helpers import assert_gradients_match

# (37, 5): more rows than layer norm's backward has blocks, and not a multiple of them
shapes = st.sampled_from([(1, 1), (1, 7), (3, 5), (2, 3, 33), (4, 1, 1024), (37, 5)])


def arrays(seed, shape, *widths, scale=1.0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) * scale] + [rng.standard_normal(w) for w in widths]


@given(shape=shapes, scale=st.sampled_from([0.1, 1.0, 4.0]), seed=st.integers(0, 2**32 - 1))
def test_bias_gelu_is_the_reference(shape, scale, seed):
    u, b = arrays(seed, shape, shape[-1], scale=scale)
    work = u.copy()
    g = fused.bias_gelu(work, b)
    np.testing.assert_array_equal(work, u + b)           # the pre-activation, kept
    # rtol: the reference's 1 + tanh cancels where gelu is tiny; atol covers it
    np.testing.assert_allclose(g, layers.gelu(u + b), rtol=1e-12, atol=1e-14)


@given(shape=shapes, overwrite=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_gelu_backward_is_the_reference(shape, overwrite, seed):
    x, = arrays(seed, shape, scale=3.0)
    dy, = arrays(seed + 1, shape)
    want, = layers.gelu_backward(dy, x)
    work = dy.copy()
    dx, = fused.gelu_backward(work, x, overwrite=overwrite)
    assert (dx is work) == overwrite
    np.testing.assert_allclose(dx, want, rtol=1e-12, atol=1e-14)


def test_gelu_on_views():
    u, b = arrays(2, (4, 6), 3)
    with pytest.raises(ValueError, match="C-contiguous"):
        fused.bias_gelu(u[:, ::2], b)                      # it could not write u back
    dy = u.T                                               # a view: overwrite makes a copy
    dx, = fused.gelu_backward(dy, u.T.copy(), overwrite=True)
    np.testing.assert_allclose(dx, layers.gelu_backward(dy, u.T)[0], rtol=1e-12, atol=1e-14)


def test_gelu_backward_matches_finite_differences():
    u, b = arrays(1, (3, 7), 7, scale=2.0)
    assert_gradients_match(lambda u: fused.bias_gelu(u.copy(), np.zeros(7)),
                           lambda dy, u: fused.gelu_backward(dy, u), (u,))


def test_gelu_in_float32_large_and_nan():
    x = np.array([[-1e30, -1e4, -30.0, -3.0, 0.0, 3.0, 30.0, 1e4, 1e30, np.nan]], np.float32)
    g = fused.bias_gelu(x.copy(), np.zeros(x.shape[1], np.float32))
    assert g.dtype == np.float32
    np.testing.assert_allclose(g[0, :-1], layers.gelu(x.astype(np.float64))[0, :-1],
                               rtol=1e-6, atol=1e-30)
    assert np.isnan(g[0, -1]) and np.isfinite(g[0, :-1]).all()
    finite = np.ascontiguousarray(x[:, 1:-2])             # -1e4 .. 1e4
    dx, = fused.gelu_backward(np.ones_like(finite), finite)
    # float32 rounding of the terms s and x ds/dx (up to about 1), which cancel near x = -3
    np.testing.assert_allclose(dx, layers.gelu_backward(np.ones((1, 7)), finite * 1.0)[0],
                               rtol=1e-6, atol=1e-6)


@given(shape=shapes, add=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_layer_norm_is_the_reference(shape, add, seed):
    x, g, b, bias = arrays(seed, shape, shape[-1], shape[-1], shape[-1], scale=3.0)
    a, = arrays(seed + 1, shape)
    if add:
        s, y, saved = fused.add_layer_norm(x, a, bias, g, b)
        np.testing.assert_allclose(s, x + a + bias, rtol=1e-15)
        x = x + a + bias
    else:
        y, saved = fused.layer_norm(x, g, b)
    np.testing.assert_allclose(y, layers.layer_norm(x, g, b), rtol=1e-10, atol=1e-12)
    xhat, rstd = layers._normalise(x, layers.LAYER_NORM_EPS)
    np.testing.assert_allclose(saved.xhat, xhat, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(saved.rstd, rstd[..., 0], rtol=1e-12)


@given(shape=shapes, residual=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_layer_norm_backward_is_the_reference(shape, residual, seed):
    x, g, b = arrays(seed, shape, shape[-1], shape[-1], scale=3.0)
    dy, r = arrays(seed + 1, shape)[0], arrays(seed + 2, shape)[0]
    _, saved = fused.layer_norm(x, g, b)
    dx, dg, db = fused.layer_norm_backward(dy, saved, g, r if residual else None)
    want = layers.layer_norm_backward(dy, x, g, b)
    np.testing.assert_allclose(dx, want[0] + (r if residual else 0), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dg, want[1], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(db, want[2], rtol=1e-10, atol=1e-12)


def test_parallel_loops_give_the_same_numbers_on_any_thread_count():
    """GELU's loops split rows among threads, and layer norm's backward sums dg and db in
    fixed blocks of rows: one thread and two give the same bits (float32, 53 rows)."""
    import numba
    rng = np.random.default_rng(11)
    x, dy, r = (rng.standard_normal((53, 96)).astype(np.float32) for _ in range(3))
    g, b = (rng.standard_normal(96).astype(np.float32) for _ in range(2))

    def run():
        _, saved = fused.layer_norm(x, g, b)
        u = x.copy()
        gelu = fused.bias_gelu(u, b)
        return (*fused.layer_norm_backward(dy, saved, g, r), gelu,
                *fused.gelu_backward(dy, u))
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = run()
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        two = run()
    finally:
        numba.set_num_threads(before)
    for a, c in zip(one, two):
        np.testing.assert_array_equal(a, c)


def test_add_layer_norm_backward_matches_finite_differences():
    x, a, bias, g, b = arrays(2, (3, 6), 6, 6, 6)[0:1] + arrays(3, (3, 6))[0:1] + \
        arrays(4, (6,), 6, 6)

    def f(x, a, bias, g, b):
        return fused.add_layer_norm(x, a, bias, g, b)[1]

    def f_backward(dy, x, a, bias, g, b):
        _, _, saved = fused.add_layer_norm(x, a, bias, g, b)
        dx, dg, db = fused.layer_norm_backward(dy, saved, g)
        return dx, dx, dx.sum(axis=0), dg, db             # s = x + a + bias
    assert_gradients_match(f, f_backward, (x, a, bias, g, b))


def test_layer_norm_float32_and_nan():
    x = np.random.default_rng(5).standard_normal((3, 9)).astype(np.float32)
    x[1, 4] = np.nan
    g, b = np.ones(9, np.float32), np.zeros(9, np.float32)
    y, saved = fused.layer_norm(x, g, b)
    assert y.dtype == saved.xhat.dtype == saved.rstd.dtype == np.float32
    assert np.isnan(y[1]).all() and np.isfinite(y[[0, 2]]).all()
    np.testing.assert_allclose(y[[0, 2]], layers.layer_norm(x[[0, 2]].astype(float), g, b),
                               rtol=1e-5, atol=1e-5)


@given(b=st.integers(1, 3), n=st.integers(1, 9), parts=st.integers(1, 3),
       heads=st.integers(1, 4), width=st.integers(1, 5),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**32 - 1))
def test_heads_from_and_to_projections_are_numpys_copies(b, n, parts, heads, width, dtype,
                                                         seed):
    """heads_from_projections is (proj + bias) reshaped and transposed to (P, B, H, N,
    d_head), as ``attention.split_heads`` does per part, and projections_from_heads puts
    parts back side by side; both exactly (copies and one add)."""
    from linattn.model.attention import merge_heads as merge_one
    rng = np.random.default_rng(seed)
    d = heads * width
    proj = rng.standard_normal((b * n, parts * d)).astype(dtype)
    bias = rng.standard_normal(parts * d).astype(dtype)
    got = fused.heads_from_projections(proj, bias, n, parts, heads)
    want = (proj + bias).reshape(b, n, parts, heads, width).transpose(2, 0, 3, 1, 4)
    assert got.shape == want.shape and got.dtype == dtype and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)
    split = [rng.standard_normal((b, heads, n, width)).astype(dtype) for _ in range(parts)]
    split[0] = split[0].transpose(0, 2, 1, 3).copy().transpose(0, 2, 1, 3)    # any strides
    np.testing.assert_array_equal(
        fused.projections_from_heads(*split),
        np.concatenate([merge_one(x).reshape(b * n, d) for x in split], axis=1))


def test_embedding_backward_is_the_reference():
    rng = np.random.default_rng(6)
    ids = rng.integers(0, 5, (3, 11))                    # repeated ids accumulate
    dout, table = rng.standard_normal((3, 11, 4)), rng.standard_normal((7, 4))
    got, = fused.embedding_backward(dout, ids, table)
    np.testing.assert_allclose(got, layers.embedding_backward(dout, ids, table)[0],
                               rtol=1e-13, atol=1e-15)


def test_sum_squares_in_float64():
    x = np.random.default_rng(8).standard_normal(100_003).astype(np.float32)
    assert isinstance(fast_optim.sum_squares(x), float)
    # float32 sums would be off by about 1e-5 here
    np.testing.assert_allclose(fast_optim.sum_squares(x), np.sum(np.square(x, dtype=np.float64)),
                               rtol=1e-12)
    assert fast_optim.sum_squares(np.zeros((0, 3))) == 0.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adam_step_is_the_numpy_formula(dtype):
    rng = np.random.default_rng(7)
    p, g, m = (rng.standard_normal((5, 3)).astype(dtype) for _ in range(3))
    v = np.abs(rng.standard_normal((5, 3))).astype(dtype)
    got = fast_optim.adam_step(p, g, m, v, 0.5, 1e-3, 0.9, 0.98, 0.1, 0.2, 1e-8)
    gs = g * dtype(0.5)
    m_want = 0.9 * m + (1 - 0.9) * gs
    v_want = 0.98 * v + (1 - 0.98) * gs * gs
    p_want = p - 1e-3 * (m_want / 0.1) / (np.sqrt(v_want / 0.2) + 1e-8)
    for a, w in zip(got, (p_want, m_want, v_want)):
        assert a.dtype == dtype
        np.testing.assert_array_equal(a, w)              # the same operations, in order
