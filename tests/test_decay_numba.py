"""The compiled gated running sums (``numba_cpu.decay_loops``) against NumPy's
(``forms.decay_recurrent``): outputs, states and every gradient, float64 to rtol 1e-10."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import random_qkv
from linattn import State, linear_attention, linear_attention_backward
from linattn.dispatch import numba_imports

pytestmark = pytest.mark.skipif(not numba_imports(), reason="numba is not installed")


@settings(max_examples=15)
@given(n=st.integers(0, 11), d=st.integers(1, 3), m=st.integers(1, 3),
       lead=st.lists(st.integers(1, 2), max_size=2).map(tuple),
       kind=st.sampled_from(["decay", "gate", "none"]), normalize=st.booleans(),
       with_state=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_numba_matches_numpy(n, d, m, lead, kind, normalize, with_state, seed):
    q, k, v = random_qkv(seed, n, d, m, lead)
    rng = np.random.default_rng(seed)
    kw = dict(causal=True, normalize=normalize, method="linear")
    if kind == "decay":
        kw["decay"] = 0.7
    if kind == "gate":
        kw["log_gate"] = -rng.uniform(0, 2, (*lead, n, d))
    if kind == "none" and normalize:
        kw["decay"] = 1.0
    back = dict(kw)
    if with_state:
        kw["initial_state"] = back["initial_state"] = State(rng.uniform(0, 1, (*lead, d, m)),
                                                            rng.uniform(0, 1, (*lead, d)))
        kw["return_state"] = True
        back["dstate"] = State(rng.standard_normal((*lead, d, m)),
                               rng.standard_normal((*lead, d)))
    got = linear_attention(q, k, v, backend="numba", **kw)
    want = linear_attention(q, k, v, backend="numpy", **kw)
    for g, w in zip(np.atleast_1d(got) if not with_state else (got[0], *got[1]),
                    np.atleast_1d(want) if not with_state else (want[0], *want[1])):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    dout = rng.standard_normal((*lead, n, m))
    got = linear_attention_backward(dout, q, k, v, backend="numba", **back)
    want = linear_attention_backward(dout, q, k, v, backend="numpy", **back)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for a, b in zip(*((g, w) if isinstance(g, tuple) else ((g,), (w,)))):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_numba_runs_the_gated_loops():
    from linattn import dispatch
    needs = dispatch.needed(causal=True, decay=0.5)
    module, backend = dispatch.kernel("linear", "linear", "numba", np, True, needs=needs)
    assert (module.__name__, backend) == ("linattn.numba_cpu.decay_loops", "numba")
    module, _ = dispatch.kernel("linear", "linear", "numba", np, True)
    assert module.__name__ == "linattn.numba_cpu.loops"


def test_float32_stays_float32_inside_the_loops():
    from test_numba_cpu import float64_in_ir

    from linattn.numba_cpu import decay_loops
    x = np.ones((2, 5, 3), np.float32)
    s, zero = np.zeros((2, 3, 3), np.float32), np.float32(0)
    assert not float64_in_ir(decay_loops._scan, x, x, x, x, s, x.copy(), zero)
    assert not float64_in_ir(decay_loops._scan_backward, x, x, x, x, x, s, s.copy(),
                             x.copy(), x.copy(), x.copy(), zero)
