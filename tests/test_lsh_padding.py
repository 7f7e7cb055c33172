"""Key padding of Reformer (LSH) attention (``key_mask``, ``key_lengths``): with shared QK a
padded position is a padded key and a padded query.

What it promises, as properties: the output is softmax attention restricted to
``lsh_attention_mask(..., key_mask=)``, a mask that never lets a real query see a padded
key and gives a padded query nothing; padded positions are hashed to a bucket of their own
and sorted last, so at its real positions a padded sequence gets exactly what it gets alone
with the same bucket count, whatever the padding holds and wherever it lies; padded outputs
and the gradients reaching padded qk and v are exactly 0, and dout there is not read;
every row is finite; the backward agrees with central differences; Numba agrees with NumPy.
"""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from linattn import lsh_attention, lsh_attention_backward, lsh_attention_mask
from linattn.forms import lsh as forms_lsh
from linattn.numba_cpu import lsh_hash

from helpers import assert_gradients_match, assert_lsh_backends_agree

BACKENDS = ("numpy", "numba")
seeds = st.integers(0, 2**32 - 1)


def padded_inputs(seed, lead, n, d, m, p_real, fill=np.nan, dtype=np.float64):
    """qk (*lead, n, d), v (*lead, n, m), a random key mask (*lead, n) with about p_real of
    the positions real, and ``fill`` at the padded ones."""
    rng = np.random.default_rng(seed)
    qk = rng.standard_normal((*lead, n, d)).astype(dtype)
    v = rng.standard_normal((*lead, n, m)).astype(dtype)
    mask = rng.random((*lead, n)) < p_real
    qk[~mask], v[~mask] = fill, fill
    return qk, v, mask


def masked_softmax(qk, v, allowed, key_mask):
    """The oracle: softmax(qk k^T / sqrt(D)) v with -inf outside ``allowed``, k the unit
    rows; it reads only real rows (padded ones are replaced by 0 first), and a row that
    allows nothing is 0."""
    real = key_mask[..., None]
    qk, v = np.where(real, qk, 0), np.where(real, v, 0)
    norm = np.linalg.norm(qk, axis=-1, keepdims=True)
    k = qk / np.where(norm == 0, 1, norm)
    logits = np.where(allowed, qk @ k.swapaxes(-1, -2) / np.sqrt(qk.shape[-1]), -np.inf)
    top = logits.max(axis=-1, keepdims=True)
    p = np.exp(logits - np.where(top == -np.inf, 0, top))
    total = p.sum(axis=-1, keepdims=True)
    return (p / np.where(total == 0, 1, total)) @ v


OPTIONS = dict(n=st.integers(1, 40), d=st.integers(1, 5), m=st.integers(1, 4),
               chunk_size=st.integers(1, 7), n_hashes=st.integers(1, 3), causal=st.booleans(),
               p_real=st.sampled_from([0.0, 0.3, 0.8, 1.0]), seed=seeds)


@given(lead=st.sampled_from([(), (2,), (2, 2)]), **OPTIONS)
def test_equals_softmax_restricted_to_the_mask_and_the_key_mask(lead, n, d, m, chunk_size,
                                                                n_hashes, causal, p_real,
                                                                seed):
    qk, v, key_mask = padded_inputs(seed, lead, n, d, m, p_real)
    kw = dict(n_hashes=n_hashes, chunk_size=chunk_size, causal=causal, seed=seed % 1000)
    allowed = lsh_attention_mask(qk, key_mask=key_mask, **kw)
    real_q, real_k = key_mask[..., :, None], key_mask[..., None, :]
    assert not (allowed & ~real_k).any()                   # no query sees a padded key
    assert not (allowed & ~real_q).any()                   # a padded query sees nothing
    assert (allowed.any(axis=-1) == key_mask).all()        # a real one sees a real key
    want = masked_softmax(qk, v, allowed & real_k, key_mask)
    out = lsh_attention(qk, v, key_mask=key_mask, backend="numpy", **kw)
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)
    assert np.all(out[~key_mask] == 0) and np.all(np.isfinite(out))


def alone(x, key_mask, idx):
    """The real rows of sequence ``idx``, in order: the sequence unpadded."""
    return x[idx][key_mask[idx]]


@given(width=st.integers(1, 30), layout=st.sampled_from(["right", "left", "scattered"]),
       chunk_size=st.integers(1, 6), n_hashes=st.integers(1, 3), causal=st.booleans(),
       fixed_buckets=st.booleans(), backend=st.sampled_from(BACKENDS), seed=seeds)
def test_at_real_positions_a_padded_batch_is_each_sequence_alone(width, layout, chunk_size,
                                                                 n_hashes, causal,
                                                                 fixed_buckets, backend, seed):
    rng = np.random.default_rng(seed)
    qk, v = 50 * rng.standard_normal((3, width, 4)), rng.standard_normal((3, width, 3))
    lengths = rng.integers(0, width + 1, 3)
    key_mask = np.arange(width) < lengths[:, None]                     # right padding
    if layout == "left":
        key_mask = key_mask[:, ::-1]
    elif layout == "scattered":
        key_mask = np.array([rng.permutation(row) for row in key_mask])
    qk[~key_mask], v[~key_mask] = np.nan, np.inf                       # anything at all
    # the default bucket count follows the padded width: alone, it is passed explicitly
    n_buckets = 2 * rng.integers(1, 6) if fixed_buckets else None
    kw = dict(n_hashes=n_hashes, chunk_size=chunk_size, causal=causal, seed=seed % 1000)
    kw_alone = dict(kw, n_buckets=n_buckets or forms_lsh.default_n_buckets(width, chunk_size))
    out = lsh_attention(qk, v, key_mask=key_mask, n_buckets=n_buckets, backend=backend, **kw)
    dout = np.where(key_mask[..., None], rng.standard_normal(out.shape), np.nan)  # not read
    dqk, dv = lsh_attention_backward(dout, qk, v, key_mask=key_mask, n_buckets=n_buckets,
                                     backend=backend, **kw)
    assert np.all(out[~key_mask] == 0)
    assert np.all(dqk[~key_mask] == 0) and np.all(dv[~key_mask] == 0)  # exactly
    real = lsh_attention_mask(qk, key_mask=key_mask, n_buckets=n_buckets, **kw)
    for idx in range(3):
        if not key_mask[idx].any():
            continue
        qk_a, v_a = alone(qk, key_mask, idx), alone(v, key_mask, idx)
        # the chunks of real positions are as unpadded: the same mask among them
        np.testing.assert_array_equal(real[idx][np.ix_(key_mask[idx], key_mask[idx])],
                                      lsh_attention_mask(qk_a, **kw_alone))
        np.testing.assert_allclose(alone(out, key_mask, idx),
                                   lsh_attention(qk_a, v_a, backend=backend, **kw_alone),
                                   rtol=1e-10, atol=1e-12)
        want = lsh_attention_backward(alone(dout, key_mask, idx), qk_a, v_a, backend=backend,
                                      **kw_alone)
        for got, w in zip((dqk, dv), want):
            np.testing.assert_allclose(alone(got, key_mask, idx), w, rtol=1e-10, atol=1e-12)


@given(rows=st.integers(1, 3), n=st.integers(1, 60), chunk_size=st.integers(1, 8),
       n_hashes=st.integers(1, 3), causal=st.booleans(), p_real=st.sampled_from([0.0, 0.5, 0.9]),
       seed=st.integers(0, 1000))
def test_padded_positions_are_sorted_last_and_the_compiled_hashing_agrees(rows, n, chunk_size,
                                                                          n_hashes, causal,
                                                                          p_real, seed):
    qk, _, key_mask = padded_inputs(seed, (rows,), n, 3, 1, p_real, fill=0.0)
    k, _ = forms_lsh.unit_keys(qk)
    kw = dict(n_hashes=n_hashes, chunk_size=chunk_size, n_buckets=None, causal=causal,
              seed=seed)
    want = forms_lsh.hashing(k, key_mask=key_mask, **kw)
    np.testing.assert_array_equal(want.length, key_mask.sum(axis=-1))
    for r in range(rows):                                  # the first L sorted: the real ones
        real = want.order[:, r, :want.length[r]]
        assert key_mask[r, real].all()
        assert not (want.has_other[r] & ~key_mask[r]).any()
    order, rank, has_other = lsh_hash.hashing(k, key_mask=key_mask, **kw)
    np.testing.assert_array_equal(order, want.order)
    np.testing.assert_array_equal(rank, want.rank)
    np.testing.assert_array_equal(has_other, want.has_other)


@given(lead=st.sampled_from([(), (1,), (2, 3)]), **OPTIONS)
def test_numba_matches_numpy(lead, n, d, m, chunk_size, n_hashes, causal, p_real, seed):
    qk, v, key_mask = padded_inputs(seed, lead, n, d, m, p_real)
    dout = np.random.default_rng(seed + 1).standard_normal(v.shape)
    kw = dict(n_hashes=n_hashes, chunk_size=chunk_size, causal=causal, seed=seed % 1000,
              key_mask=key_mask)
    assert_lsh_backends_agree(qk, v, dout, **kw)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_hashes", [1, 3])
def test_numba_float32_matches_numpy(causal, n_hashes):
    qk, v, key_mask = padded_inputs(5, (2,), 203, 16, 8, 0.7, dtype=np.float32)
    dout = np.random.default_rng(6).standard_normal(v.shape).astype(np.float32)
    kw = dict(n_hashes=n_hashes, chunk_size=8, causal=causal, key_mask=key_mask)
    got = lsh_attention(qk, v, backend="numba", **kw)
    assert got.dtype == np.float32 and np.all(got[~key_mask] == 0)
    np.testing.assert_allclose(got, lsh_attention(qk, v, backend="numpy", **kw),
                               rtol=1e-4, atol=1e-5)
    for g, w in zip(lsh_attention_backward(dout, qk, v, backend="numba", **kw),
                    lsh_attention_backward(dout, qk, v, backend="numpy", **kw)):
        assert g.dtype == np.float32 and np.all(g[~key_mask] == 0)
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_hashes, chunk_size, causal", [
    (1, 2, False), (1, 3, True), (2, 2, False), (3, 2, True), (2, 4, True)])
def test_backward_matches_finite_differences(backend, n_hashes, chunk_size, causal):
    # finite garbage at the padded positions: central differences there must be 0 too
    qk, v, key_mask = padded_inputs(7, (2,), 11, 3, 2, 0.7, fill=5.0)
    kw = dict(n_hashes=n_hashes, chunk_size=chunk_size, causal=causal, seed=3,
              key_mask=key_mask)
    buckets = lsh_attention_mask(qk, **kw)

    def f(qk, v):
        # the hash is piecewise constant: a step of 1e-6 must not move any position
        np.testing.assert_array_equal(lsh_attention_mask(qk, **kw), buckets)
        return lsh_attention(qk, v, backend=backend, **kw)

    assert_gradients_match(
        f, lambda dout, qk, v: lsh_attention_backward(dout, qk, v, backend=backend, **kw),
        (qk, v))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_rows_with_no_real_position_are_zero_and_finite(backend, causal, dtype):
    qk, v, _ = padded_inputs(3, (3,), 9, 3, 2, 1.0, dtype=dtype)
    lengths = np.array([0, 1, 9])
    kw = dict(n_hashes=2, chunk_size=2, causal=causal, backend=backend)
    out = lsh_attention(qk, v, key_lengths=lengths, **kw)
    assert out.dtype == dtype and np.all(out[0] == 0) and np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[1, 0], v[1, 0])      # alone: it sees only itself
    np.testing.assert_array_equal(out, lsh_attention(qk, v, key_mask=np.arange(9) <
                                                     lengths[:, None], **kw))
    grads = lsh_attention_backward(np.ones_like(out), qk, v, key_lengths=lengths, **kw)
    assert all(g.dtype == dtype and np.all(g[0] == 0) and np.all(np.isfinite(g))
               for g in grads)
    assert not lsh_attention_mask(qk, key_lengths=lengths, n_hashes=2, chunk_size=2,
                                  causal=causal)[0].any()


def test_a_full_mask_changes_nothing():
    qk, v, _ = padded_inputs(4, (2,), 30, 4, 3, 1.0)
    kw = dict(n_hashes=2, chunk_size=4, causal=True)
    for backend in BACKENDS:
        np.testing.assert_array_equal(
            lsh_attention(qk, v, key_mask=np.ones(30, bool), backend=backend, **kw),
            lsh_attention(qk, v, backend=backend, **kw))
    np.testing.assert_array_equal(lsh_attention_mask(qk, key_lengths=np.array(30), **kw),
                                  lsh_attention_mask(qk, **kw))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(key_mask=np.ones(6, bool), key_lengths=np.array([6, 6])), ValueError, "not both"),
    (dict(key_mask=np.ones(5, bool)), ValueError, "key_mask must have a shape"),
    (dict(key_mask=np.ones(6)), TypeError, "boolean"),
    (dict(key_lengths=np.array([3, 7])), ValueError, "0..Nk"),
    (dict(key_lengths=np.array([1.0, 2.0])), TypeError, "integer"),
])
def test_bad_masks(kwargs, error, match):
    qk, v, _ = padded_inputs(15, (2,), 6, 3, 2, 1.0)
    with pytest.raises(error, match=match):
        lsh_attention(qk, v, **kwargs)
    with pytest.raises(error, match=match):
        lsh_attention_backward(v, qk, v, **kwargs)
    with pytest.raises(error, match=match):
        lsh_attention_mask(qk, **kwargs)
