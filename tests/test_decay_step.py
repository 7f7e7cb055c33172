"""The gated step (``forms.decay_recurrent.step`` behind ``linear_attention_step`` and
``Recurrence``): scanning it reproduces the causal forms with a decay, a log gate and
without the normaliser, and its bad inputs are refused."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import random_qkv
from linattn import Recurrence, linear_attention, linear_attention_step


def scan(q, k, v, g, **kw):
    """linear_attention_step over the positions of (..., N, D) inputs: outputs, last state."""
    state, outs = None, []
    for i in range(q.shape[-2]):
        gate = None if g is None else g[..., i, :]
        out, state = linear_attention_step(q[..., i, :], k[..., i, :], v[..., i, :], state,
                                           log_gate_t=gate, **kw)
        outs.append(out)
    return np.stack(outs, axis=-2), state


@settings(max_examples=15)
@given(n=st.integers(1, 9), d=st.integers(1, 3), m=st.integers(1, 3),
       lead=st.lists(st.integers(1, 2), max_size=2).map(tuple),
       kind=st.sampled_from(["decay", "gate", "both", "none"]), normalize=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_scanning_the_step_reproduces_the_causal_forms(n, d, m, lead, kind, normalize, seed):
    q, k, v = random_qkv(seed, n, d, m, lead)
    rng = np.random.default_rng(seed)
    decay = rng.uniform(0.3, 1.0, lead[-1:]) if kind in ("decay", "both") else None
    g = -rng.uniform(0, 2, (*lead, n, d)) if kind in ("gate", "both") else None
    kw = dict(decay=decay, normalize=normalize)
    got, state = scan(q, k, v, g, **kw)
    for method in ("quadratic", "chunked"):
        want, final = linear_attention(q, k, v, causal=True, log_gate=g, method=method,
                                       return_state=True, **kw)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(state.S, final.S, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(state.z, final.z, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("normalize", [True, False])
def test_recurrence_matches_the_step(normalize):
    q, k, v = random_qkv(1, 6, 3, 2, (2,))
    g = -np.random.default_rng(1).uniform(0, 2, (2, 6, 3))
    decay = np.array([0.9, 0.5])
    want, state = scan(q, k, v, g, decay=decay, normalize=normalize)
    rnn = Recurrence((2,), 3, 2, dtype="float64", decay=decay, gated=True,
                     normalize=normalize)
    got = np.stack([rnn.step(q[:, i], k[:, i], v[:, i], g[:, i]) for i in range(6)], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(rnn.state.S, state.S, rtol=1e-12)
    plain = Recurrence((2,), 3, 2, dtype="float64", decay=decay)
    got = np.stack([plain.step(q[:, i], k[:, i], v[:, i]) for i in range(6)], axis=1)
    np.testing.assert_allclose(got, scan(q, k, v, None, decay=decay)[0], rtol=1e-12)


def test_bad_step_inputs_are_refused():
    q, k, v = random_qkv(2, 1, 3, 2, (2,))
    q, k, v = q[:, 0], k[:, 0], v[:, 0]
    with pytest.raises(ValueError, match="compensated"):
        linear_attention_step(q, k, v, decay=0.5, compensated=True)
    with pytest.raises(ValueError, match="F = 3"):
        linear_attention_step(q, k, v, log_gate_t=np.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        linear_attention_step(q, k, v, decay=1.5)
    with pytest.raises(ValueError, match="gated=True"):
        Recurrence((2,), 3, 2, dtype="float64").step(q, k, v, np.zeros((2, 3)))
    with pytest.raises(ValueError, match="gated=True"):
        Recurrence((2,), 3, 2, dtype="float64", gated=True).step(q, k, v)
    with pytest.raises(ValueError, match="compensated"):
        Recurrence((2,), 3, 2, decay=0.5, compensated=True)
