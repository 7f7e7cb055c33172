"""The Numba kernel-matrix kernel (``numba_cpu.quadratic``) against the NumPy oracle
(``forms.quadratic``), Eq. (4) / (8): drawn shapes, views of any strides, its blocks, its
gradient against finite differences, float32, NaN."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from linattn import linear_attention, linear_attention_backward
from linattn.numba_cpu import chunked, quadratic

from helpers import assert_gradients_match, random_qkv

leads = st.sampled_from([(), (2,), (2, 3), (2, 1, 2)])


def both(q, k, v, dout, **kw):
    """(out, dq, dk, dv) by the oracle and by the kernel."""
    paths = [dict(method="quadratic", backend=b) for b in ("numpy", "numba")]
    return [(linear_attention(q, k, v, **p, **kw),
             *linear_attention_backward(dout, q, k, v, **p, **kw)) for p in paths]


@given(n=st.integers(1, 40), nk=st.integers(0, 40), d=st.integers(1, 6), m=st.integers(1, 6),
       lead=leads, causal=st.booleans(), fmap=st.sampled_from(["elu+1", "relu", "taylor"]),
       seed=st.integers(0, 2**32 - 1))
def test_matches_the_oracle(n, nk, d, m, lead, causal, fmap, seed):
    # elu+1 is fused into the kernel, the others applied before it; without the mask the
    # keys may be fewer or more than the queries, or none
    q, _, _ = random_qkv(seed, n, d, m, lead)
    _, k, v = random_qkv(seed + 1, n if causal else nk, d, m, lead)
    dout = np.random.default_rng(seed + 2).standard_normal((*lead, n, m))
    want, got = both(q, k, v, dout, causal=causal, feature_map=fmap)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-11)


def test_views_of_any_strides_and_the_output_layout():
    # heads split from one projection (B, N, 3, H, D), as the model's: read in place, and
    # the output laid out as the queries, so that merging the heads back copies nothing
    rng = np.random.default_rng(3)
    proj = rng.standard_normal((2, 37, 3, 4, 5))
    q, k, v = (proj[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    dout = rng.standard_normal((2, 37, 4, 5)).transpose(0, 2, 1, 3)
    copies = [np.ascontiguousarray(x) for x in (q, k, v, dout)]
    kw = dict(causal=True, method="quadratic", backend="numba")
    out = linear_attention(q, k, v, **kw)
    assert out.transpose(0, 2, 1, 3).flags.c_contiguous
    np.testing.assert_array_equal(out, linear_attention(*copies[:3], **kw))
    for g, w in zip(linear_attention_backward(dout, q, k, v, **kw),
                    linear_attention_backward(*copies[3:], *copies[:3], **kw)):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("block", [1, 3, 8, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_block_length_changes_nothing(block, causal):
    q, k, v = random_qkv(4, 29, 3, 4, (2,))
    dout = np.random.default_rng(5).standard_normal(v.shape)
    four = [quadratic._four_d(x) for x in (q, k, v, dout)]
    want = linear_attention(q, k, v, causal=causal, method="quadratic", backend="numpy")
    out = np.empty_like(v)
    none = np.empty((0, 0, 0, 0))                        # no state in, none out
    quadratic._forward(*four[:3], causal, 1e-6, True, block, quadratic._four_d(out), none,
                       none)
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)
    grads = [np.empty_like(x) for x in (q, k, v)]
    quadratic._backward(*four, causal, 1e-6, True, block, *map(quadratic._four_d, grads),
                        none, none, none)
    oracle = linear_attention_backward(dout, q, k, v, causal=causal, method="quadratic",
                                       backend="numpy")
    for g, w in zip(grads, oracle):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-11)


def test_blocks_keep_each_product_on_the_calling_thread():
    for n, d, m in [(127, 32, 32), (4096, 64, 64), (300, 512, 8), (1, 1, 1)]:
        c = quadratic.block_length(n, d, m)
        assert c >= 1 and (c == 1 or c * n * max(d, m) < chunked.SINGLE_THREAD_PRODUCT)
    assert quadratic.block_length(127, 32, 32) == quadratic.DEFAULT_BLOCK


@pytest.mark.parametrize("causal", [False, True])
def test_backward_matches_finite_differences(causal):
    q, k, v = random_qkv(6, 7, 3, 2, (2,))
    kw = dict(causal=causal, method="quadratic", backend="numba")
    assert_gradients_match(lambda q, k, v: linear_attention(q, k, v, **kw),
                           lambda dout, q, k, v: linear_attention_backward(dout, q, k, v, **kw),
                           (q, k, v))


@pytest.mark.parametrize("causal", [False, True])
def test_float32_stays_float32_and_close_to_float64(causal):
    q, k, v = random_qkv(7, 127, 32, 32, (3, 2))
    dout = np.random.default_rng(8).standard_normal(v.shape)
    kw = dict(causal=causal, method="quadratic", backend="numba")
    got = [linear_attention(*(x.astype(np.float32) for x in (q, k, v)), **kw),
           *linear_attention_backward(*(x.astype(np.float32) for x in (dout, q, k, v)), **kw)]
    want = [linear_attention(q, k, v, **kw), *linear_attention_backward(dout, q, k, v, **kw)]
    for g, w in zip(got, want):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4 * np.abs(w).max())


def test_nan_in_gives_nan_out_where_the_oracle_has_it():
    q, k, v = random_qkv(9, 12, 3, 2)
    k[5, 1] = np.nan                       # key 5: every query from 5 on sees it
    kw = dict(causal=True, method="quadratic")
    want = linear_attention(q, k, v, backend="numpy", **kw)
    got = linear_attention(q, k, v, backend="numba", **kw)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[5:]).all() and not np.isnan(got[:5]).any()
