"""The compiled hashing of LSH attention (``numba_cpu.lsh_hash``) against NumPy: the argmax
of [p, -p] without the concatenation, the counting sort against a stable argsort, the
buckets made a tile of rotations at a time against the reference's one product, and the
whole hashing (order, rank, has_other) against ``forms.lsh.hashing``."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from linattn.forms import lsh as forms_lsh
from linattn.numba_cpu import lsh_hash

SPECIAL = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, np.inf, -np.inf, np.nan]


@given(st.lists(st.sampled_from(SPECIAL) | st.floats(-3, 3, width=32), min_size=1,
                max_size=12))
def test_plus_minus_argmax_is_numpys(values):
    p = np.array(values)                     # ties, signed zeros, infinities and NaN
    assert lsh_hash.plus_minus_argmax(p) == np.argmax(np.concatenate([p, -p]))


@given(n=st.integers(1, 300), n_buckets=st.integers(1, 40), seed=st.integers(0, 1000))
def test_counting_sort_is_a_stable_argsort(n, n_buckets, seed):
    bucket = np.random.default_rng(seed).integers(0, n_buckets, n)
    order, rank = np.empty(n, np.int64), np.empty(n, np.int64)
    lsh_hash.sort_by_bucket(bucket, n_buckets, order, rank)
    np.testing.assert_array_equal(order, np.argsort(bucket, kind="stable"))
    np.testing.assert_array_equal(rank[order], np.arange(n))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n, d, n_buckets", [
    (1, 3, 2), (50, 1, 6), (300, 64, 2), (300, 64, 254), (1000, 5, 130), (130, 200, 300)])
def test_buckets_in_tiles_equal_one_product(dtype, n, d, n_buckets):
    # several tiles of rotations (the last one short) and several blocks of positions
    rng = np.random.default_rng(n + d)
    k, _ = forms_lsh.unit_keys(rng.standard_normal((2, n, d)).astype(dtype))
    k[1, n // 2] = 0                                      # a zero key: every p_b is 0
    k[0, n // 3, d // 2] = np.nan                         # a NaN key
    rotations = forms_lsh.rotations(d, n_hashes=2, n_buckets=n_buckets, seed=n)
    got = np.empty((2, 2, n), np.int64)
    lsh_hash.buckets(k, np.ascontiguousarray(rotations.astype(dtype).swapaxes(1, 2)), got)
    for h in range(2):
        np.testing.assert_array_equal(got[h], forms_lsh.buckets(k, rotations[h]))


@given(n=st.integers(1, 90), d=st.integers(1, 6), chunk_size=st.integers(1, 9),
       n_hashes=st.integers(1, 4), causal=st.booleans(), seed=st.integers(0, 1000),
       rows=st.integers(1, 3))
def test_hashing_is_the_references(n, d, chunk_size, n_hashes, causal, seed, rows):
    qk = np.random.default_rng(seed).standard_normal((rows, n, d))
    k, _ = forms_lsh.unit_keys(qk)
    kw = dict(n_hashes=n_hashes, chunk_size=chunk_size, n_buckets=None, causal=causal,
              seed=seed)
    want = forms_lsh.hashing(k, **kw)
    order, rank, has_other = lsh_hash.hashing(k, **kw)
    np.testing.assert_array_equal(order, want.order)
    np.testing.assert_array_equal(rank, want.rank)
    np.testing.assert_array_equal(has_other, want.has_other)
