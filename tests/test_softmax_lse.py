"""Softmax attention's log-sum-exp: the forward returns it (``return_lse``) and the backward
takes it with the output (``out``, ``lse``) instead of recomputing the forward. Held to SciPy's
logsumexp of the masked logits, to the backward without them (bit for bit on Numba, whose
order of operations does not change), and to central differences; wrong values change the
gradients (so they are used); bad arguments are clear errors."""
import numpy as np
import pytest
from hypothesis import given, strategies as st
from scipy.special import logsumexp

from linattn import softmax_attention, softmax_attention_backward

from helpers import assert_gradients_match

BACKENDS = ("numpy", "numba")
LEADS = [(), (3,), (2, 2)]


def draw(seed, lead, nq, nk, d, m, dtype=np.float64):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((*lead, nq, d)), rng.standard_normal((*lead, nk, d))
    v, dout = rng.standard_normal((*lead, nk, m)), rng.standard_normal((*lead, nq, m))
    return tuple(x.astype(dtype) for x in (q, k, v, dout))


def masked_logits(q, k, causal, scale, key_mask):
    """scale q k^T with -inf above the diagonal (causal) and at padded keys."""
    logits = scale * (q @ np.swapaxes(k, -1, -2))
    if causal:
        n = q.shape[-2]
        logits = np.where(np.tril(np.ones((n, n), dtype=bool)), logits, -np.inf)
    if key_mask is not None:
        logits = np.where(key_mask[..., None, :], logits, -np.inf)
    return logits


def key_mask_for(seed, lead, nk):
    """A random mask of real keys (..., Nk): some sequences all padding, some none."""
    rng = np.random.default_rng(seed + 1)
    lengths = rng.integers(0, nk + 1, size=lead)
    return np.arange(nk) < np.asarray(lengths)[..., None]


def calls(max_n, max_width):
    """Hypothesis's arguments: sizes up to ``max_n`` positions and ``max_width`` features,
    leading axes, causal or not, a random key mask or none, a seed."""
    return dict(nq=st.integers(1, max_n), nk=st.integers(1, max_n),
                d=st.integers(1, max_width), m=st.integers(1, max_width),
                lead=st.sampled_from(LEADS), causal=st.booleans(), masked=st.booleans(),
                seed=st.integers(0, 2**32 - 1))


def one_call(backend, nq, nk, d, m, lead, causal, masked, seed):
    """(q, k, v, dout, keywords) for one drawn call (causal: Nk = Nq)."""
    nk = nq if causal else nk
    q, k, v, dout = draw(seed, lead, nq, nk, d, m)
    mask = key_mask_for(seed, lead, nk) if masked else None
    return q, k, v, dout, dict(causal=causal, backend=backend, key_mask=mask)


@pytest.mark.parametrize("backend", BACKENDS)
@given(**calls(80, 9))
def test_lse_is_the_log_sum_exp_of_the_visible_logits(backend, nq, nk, d, m, lead, causal,
                                                      masked, seed):
    q, k, v, _, kw = one_call(backend, nq, nk, d, m, lead, causal, masked, seed)
    out, lse = softmax_attention(q, k, v, return_lse=True, **kw)
    assert lse.shape == q.shape[:-1] and lse.dtype == np.float64
    np.testing.assert_array_equal(out, softmax_attention(q, k, v, **kw))   # out unchanged
    want = logsumexp(masked_logits(q, k, causal, d ** -0.5, kw["key_mask"]), axis=-1)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want))   # all padded: -inf
    finite = np.isfinite(want)
    np.testing.assert_allclose(lse[finite], want[finite], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@given(**calls(150, 70))
def test_backward_given_out_and_lse_is_the_backward(backend, nq, nk, d, m, lead, causal,
                                                    masked, seed):
    q, k, v, dout, kw = one_call(backend, nq, nk, d, m, lead, causal, masked, seed)
    out, lse = softmax_attention(q, k, v, return_lse=True, **kw)
    got = softmax_attention_backward(dout, q, k, v, out=out, lse=lse, **kw)
    want = softmax_attention_backward(dout, q, k, v, **kw)
    for g, w in zip(got, want):
        if backend == "numba":        # the same tiles in the same order: the same bits
            np.testing.assert_array_equal(g, w)
        else:                         # exp(L - lse) against softmax(L): rounding apart
            np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal, nq, nk", [(False, 3, 5), (False, 1, 4), (True, 4, 4),
                                            (True, 1, 1)])
def test_backward_given_lse_matches_finite_differences(backend, causal, nq, nk):
    q, k, v, _ = draw(7, (2,), nq, nk, 3, 2)
    mask = np.array([[True] * nk, [True] * (nk - 1) + [False]]) if not causal else None
    kw = dict(causal=causal, backend=backend, key_mask=mask)

    def backward(dout, q, k, v):
        out, lse = softmax_attention(q, k, v, return_lse=True, **kw)
        return softmax_attention_backward(dout, q, k, v, out=out, lse=lse, **kw)

    assert_gradients_match(lambda q, k, v: softmax_attention(q, k, v, **kw), backward,
                           (q, k, v))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_backward_uses_the_lse_it_is_given(backend):
    """lse + 1 divides every probability by e: dv = P^T dout scales by 1 / e."""
    q, k, v, dout = draw(3, (2,), 12, 12, 4, 5)
    out, lse = softmax_attention(q, k, v, causal=True, backend=backend, return_lse=True)
    _, _, dv = softmax_attention_backward(dout, q, k, v, causal=True, backend=backend,
                                          out=out, lse=lse)
    _, _, dv_shifted = softmax_attention_backward(dout, q, k, v, causal=True,
                                                  backend=backend, out=out, lse=lse + 1)
    np.testing.assert_allclose(dv_shifted, dv / np.e, rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_backward_uses_the_out_it_is_given(backend):
    """rowsum(dP * P) is read off dout . out: another out gives another dq."""
    q, k, v, dout = draw(4, (), 9, 9, 3, 3)
    out, lse = softmax_attention(q, k, v, backend=backend, return_lse=True)
    kw = dict(backend=backend, lse=lse)
    dq = softmax_attention_backward(dout, q, k, v, out=out, **kw)[0]
    dq_other = softmax_attention_backward(dout, q, k, v, out=out + 1, **kw)[0]
    assert np.abs(dq - dq_other).max() > 1e-3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_dtypes(backend, dtype):
    """out in the inputs' dtype; lse in the dtype computed in (float32 for float16)."""
    q, k, v, dout = draw(5, (2,), 20, 20, 8, 8, dtype)
    out, lse = softmax_attention(q, k, v, causal=True, backend=backend, return_lse=True)
    assert out.dtype == dtype and lse.dtype == np.float32
    grads = softmax_attention_backward(dout, q, k, v, causal=True, backend=backend, out=out,
                                       lse=lse)
    want = softmax_attention_backward(dout, q, k, v, causal=True, backend=backend)
    for g, w in zip(grads, want):
        assert g.dtype == dtype
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                   rtol=1e-2 if dtype == np.float16 else 1e-5, atol=1e-2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_query_poisons_only_its_lse_and_large_logits_stay_finite(backend):
    q, k, v, _ = draw(6, (), 10, 10, 4, 4, np.float32)
    q[3, 0] = np.nan
    _, lse = softmax_attention(q, k, v, backend=backend, return_lse=True)
    assert np.isnan(lse[3]) and np.isfinite(np.delete(lse, 3)).all()
    q = k = np.full((10, 4), 100, np.float32)    # logits 100^2 4 / sqrt(4): exp overflows
    _, lse = softmax_attention(q, k, v, backend=backend, return_lse=True)
    np.testing.assert_allclose(lse, 20000 + np.log(10), rtol=1e-6)


def test_bad_arguments_are_clear_errors():
    q, k, v, dout = draw(8, (2,), 6, 6, 3, 4)
    out, lse = softmax_attention(q, k, v, return_lse=True)
    with pytest.raises(TypeError, match="return_lse"):
        softmax_attention(q, k, v, return_lse="yes")
    with pytest.raises(ValueError, match="out and lse go together"):
        softmax_attention_backward(dout, q, k, v, out=out)
    with pytest.raises(ValueError, match="out and lse go together"):
        softmax_attention_backward(dout, q, k, v, lse=lse)
    with pytest.raises(ValueError, match=r"\(\.\.\., Nq\)"):
        softmax_attention_backward(dout, q, k, v, out=out, lse=lse[..., :-1])
    with pytest.raises(ValueError, match=r"\(\.\.\., Nq, M\)"):
        softmax_attention_backward(dout, q, k, v, out=out[..., :-1], lse=lse)
    with pytest.raises(TypeError, match="lse must be a float"):
        softmax_attention_backward(dout, q, k, v, out=out, lse=lse.astype(int))
