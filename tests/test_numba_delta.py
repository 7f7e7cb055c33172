"""The delta rule's compiled kernels against NumPy's forms, their oracles: the scan
(``numba_cpu.delta``) against ``forms.delta``, the WY chunks (``numba_cpu.delta_chunked``)
against ``forms.delta_chunked`` and the scan; outputs, final states and every gradient,
float64 to rtol 1e-10; float32 close. Gradient checks and memory: ``test_delta``."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from linattn import (delta_rule_attention, delta_rule_attention_backward, delta_rule_step,
                     dispatch)

pytest.importorskip("numba")

leads = st.sampled_from([(), (2,), (2, 3)])
TIGHT, GRAD = dict(rtol=1e-10, atol=1e-12), dict(rtol=1e-10, atol=1e-11)


def inputs(seed, n, d, m, lead=(), dtype=np.float64):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, *lead, n, d))
    v = rng.standard_normal((*lead, n, m))
    beta = rng.uniform(0.05, 1.0, (*lead, n))
    S0, dS = rng.standard_normal((2, *lead, d, m))
    dout = rng.standard_normal(v.shape)
    return tuple(x.astype(dtype) for x in (q, k, v, beta, S0, dS, dout))


def assert_all_close(got, want, tol):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, **tol)


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
    np.testing.assert_allclose(got, want, **TIGHT)
    np.testing.assert_allclose(S, want_S, **TIGHT)
    want = delta_rule_attention_backward(dout, q, k, v, beta, backend="numpy", dstate=dS, **kw)
    got = delta_rule_attention_backward(dout, q, k, v, beta, backend="numba", dstate=dS, **kw)
    assert len(got) == (5 if start else 4)
    assert_all_close(got, want, GRAD)


# chunk sizes: one position, ragged (N not a multiple), the default 32, and more than N
@given(n=st.integers(1, 40), d=st.integers(1, 6), m=st.integers(1, 6), lead=leads,
       chunk=st.sampled_from([None, 1, 2, 3, 5, 8, 64]), start=st.booleans(),
       final=st.booleans(), fmap=st.sampled_from(["elu+1", None]),
       seed=st.integers(0, 2**32 - 1))
@settings(max_examples=40)
def test_numba_chunked_matches_numpys_chunked_form_and_the_scan(n, d, m, lead, chunk, start,
                                                                 final, fmap, seed):
    q, k, v, beta, S0, dS, dout = inputs(seed, n, d, m, lead)
    kw = dict(feature_map=fmap, initial_state=S0 if start else None, return_state=final)
    got = delta_rule_attention(q, k, v, beta, method="chunked", backend="numba",
                               chunk_size=chunk, **kw)
    form = delta_rule_attention(q, k, v, beta, method="chunked", backend="numpy",
                                chunk_size=chunk, **kw)
    scan = delta_rule_attention(q, k, v, beta, method="recurrent", backend="numpy", **kw)
    if not final:
        got, form, scan = (got,), (form,), (scan,)
    assert got[0].shape == (*lead, n, m)
    assert_all_close(got, form, TIGHT)
    assert_all_close(got, scan, TIGHT)
    # backward, with a gradient of the final state or without
    kw = dict(feature_map=fmap, initial_state=kw["initial_state"], dstate=dS if final else None)
    got = delta_rule_attention_backward(dout, q, k, v, beta, method="chunked", backend="numba",
                                        chunk_size=chunk, **kw)
    form = delta_rule_attention_backward(dout, q, k, v, beta, method="chunked",
                                         backend="numpy", chunk_size=chunk, **kw)
    scan = delta_rule_attention_backward(dout, q, k, v, beta, method="recurrent",
                                         backend="numpy", **kw)
    assert len(got) == (5 if start else 4)
    assert_all_close(got, form, GRAD)
    assert_all_close(got, scan, GRAD)


def test_numba_step_and_float32():
    q, k, v, beta, S0, _, _ = inputs(3, 6, 4, 3, (2,))
    want = delta_rule_step(q[:, 0], k[:, 0], v[:, 0], beta[:, 0], S0, backend="numpy")
    got = delta_rule_step(q[:, 0], k[:, 0], v[:, 0], beta[:, 0], S0, backend="numba")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, **TIGHT)
    q, k, v, beta = (x.astype(np.float32) for x in (q, k, v, beta))
    got = delta_rule_attention(q, k, v, beta, method="recurrent", backend="numba")
    want = delta_rule_attention(q, k, v, beta, method="recurrent", backend="numpy")
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("chunk", [None, 5])
def test_numba_chunked_float32_stays_float32_and_close(chunk):
    """float32 in, float32 computed and returned, within a few hundred ulps of float64."""
    arrays = inputs(4, 37, 6, 5, (2,))
    q, k, v, beta, S0, dS, dout = (x.astype(np.float32) for x in arrays)
    kw = dict(method="chunked", chunk_size=chunk)
    got = delta_rule_attention(q, k, v, beta, backend="numba", initial_state=S0,
                               return_state=True, **kw)
    want = delta_rule_attention(*arrays[:4], backend="numpy", initial_state=arrays[4],
                                return_state=True, **kw)
    for g, w in zip(got, want):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    got = delta_rule_attention_backward(dout, q, k, v, beta, backend="numba", initial_state=S0,
                                        dstate=dS, **kw)
    want = delta_rule_attention_backward(arrays[6], *arrays[:4], backend="numpy",
                                         initial_state=arrays[4], dstate=arrays[5], **kw)
    for g, w in zip(got, want):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_auto_on_numba_is_the_chunked_kernel():
    module, backend = dispatch.kernel("delta", "auto", "numba", np, True, (100, 8))
    assert (module.__name__, backend) == ("linattn.numba_cpu.delta_chunked", "numba")
    module, backend = dispatch.kernel("delta", "auto", "auto", np, True)
    assert (module.__name__, backend) == ("linattn.numba_cpu.delta_chunked", "numba")
    q, k, v, beta, *_ = inputs(1, 9, 3, 2)
    np.testing.assert_array_equal(
        delta_rule_attention(q, k, v, beta, backend="numba"),
        delta_rule_attention(q, k, v, beta, method="chunked", backend="numba"))


@pytest.mark.slow
def test_numba_chunked_float32_stays_float32_inside_the_loops():
    from linattn.numba_cpu import delta_chunked
    from test_numba_cpu import float64_in_ir
    x, b = np.ones((2, 5, 3), np.float32), np.full((2, 5), 0.5, np.float32)
    S = np.zeros((2, 3, 3), np.float32)
    assert not float64_in_ir(delta_chunked._forward, x, x, x, b, S.copy(), x.copy(), 2)
    assert not float64_in_ir(delta_chunked._backward, x, x, x, x, b, S, S.copy(), x.copy(),
                             x.copy(), x.copy(), b.copy(), 2)
