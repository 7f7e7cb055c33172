"""The delta rule's compiled scan (``numba_cpu.delta``) against NumPy's recurrent form, its
oracle: outputs, final states and every gradient, float64 to rtol 1e-10; float32 close."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from linattn import delta_rule_attention, delta_rule_attention_backward, delta_rule_step

pytest.importorskip("numba")

leads = st.sampled_from([(), (2,), (2, 3)])


def inputs(seed, n, d, m, lead=(), dtype=np.float64):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, *lead, n, d))
    v = rng.standard_normal((*lead, n, m))
    beta = rng.uniform(0.05, 1.0, (*lead, n))
    S0, dS = rng.standard_normal((2, *lead, d, m))
    dout = rng.standard_normal(v.shape)
    return tuple(x.astype(dtype) for x in (q, k, v, beta, S0, dS, dout))


@given(n=st.integers(0, 20), d=st.integers(1, 5), m=st.integers(1, 5), lead=leads,
       start=st.booleans(), segment=st.sampled_from([None, 1, 3, 7]),
       fmap=st.sampled_from(["elu+1", None]), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=25)
def test_numba_matches_numpy(n, d, m, lead, start, segment, fmap, seed):
    q, k, v, beta, S0, dS, dout = inputs(seed, n, d, m, lead)
    kw = dict(method="recurrent", feature_map=fmap, chunk_size=segment,
              initial_state=S0 if start else None)
    want, want_S = delta_rule_attention(q, k, v, beta, backend="numpy", return_state=True,
                                        **kw)
    got, S = delta_rule_attention(q, k, v, beta, backend="numba", return_state=True, **kw)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(S, want_S, rtol=1e-10, atol=1e-12)
    want = delta_rule_attention_backward(dout, q, k, v, beta, backend="numpy", dstate=dS, **kw)
    got = delta_rule_attention_backward(dout, q, k, v, beta, backend="numba", dstate=dS, **kw)
    assert len(got) == len(want) == (5 if start else 4)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-11)


def test_numba_step_and_float32():
    q, k, v, beta, S0, _, _ = inputs(3, 6, 4, 3, (2,))
    want = delta_rule_step(q[:, 0], k[:, 0], v[:, 0], beta[:, 0], S0, backend="numpy")
    got = delta_rule_step(q[:, 0], k[:, 0], v[:, 0], beta[:, 0], S0, backend="numba")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    q, k, v, beta = (x.astype(np.float32) for x in (q, k, v, beta))
    got = delta_rule_attention(q, k, v, beta, method="recurrent", backend="numba")
    want = delta_rule_attention(q, k, v, beta, method="recurrent", backend="numpy")
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_numba_has_no_chunked_form():
    q, k, v, beta, *_ = inputs(1, 4, 2, 2)
    with pytest.raises(ValueError, match="'chunked' has no numba kernel.*recurrent"):
        delta_rule_attention(q, k, v, beta, method="chunked", backend="numba")
