"""The RNN form, section 3.4: scanning linear_attention_step reproduces causal attention,
and the state (S, z) of the RNN, Eq. (16)-(20), is a plain, inspectable value."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from linattn import State, linear_attention, linear_attention_step
from linattn.feature_maps import get_feature_map

from helpers import FEATURE_MAP_NAMES, random_qkv
from test_linear import BACKENDS, feature_map


def scan(q, k, v, **kw):
    """Run the step function over positions; return the outputs and the final state."""
    state, outs = None, []
    for i in range(q.shape[-2]):
        out, state = linear_attention_step(q[..., i, :], k[..., i, :], v[..., i, :], state, **kw)
        outs.append(out)
    return np.stack(outs, axis=-2), state


@pytest.mark.parametrize("backend", BACKENDS)
@given(n=st.integers(1, 25), d=st.integers(1, 5), m=st.integers(1, 5),
       lead=st.sampled_from([(), (2,), (2, 3)]), fmap=st.sampled_from(FEATURE_MAP_NAMES),
       method=st.sampled_from(["quadratic", "linear", "chunked"]),
       seed=st.integers(0, 2**32 - 1))
def test_scanning_the_step_equals_causal_attention(backend, n, d, m, lead, fmap, method, seed):
    q, k, v = random_qkv(seed, n, d, m, lead)
    fm = feature_map(fmap)
    got, _ = scan(q, k, v, feature_map=fm, backend=backend)
    want = linear_attention(q, k, v, causal=True, feature_map=fm, method=method, chunk_size=4)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_is_the_papers_sums(backend):
    q, k, v = random_qkv(1, 6, 3, 4, (2,))
    _, state = scan(q, k, v, backend=backend)
    phi_k = get_feature_map("elu+1").forward(k)
    assert isinstance(state, State) and state.S.shape == (2, 3, 4) and state.z.shape == (2, 3)
    np.testing.assert_allclose(state.S, np.einsum("bnf,bnm->bfm", phi_k, v), rtol=1e-12)
    np.testing.assert_allclose(state.z, phi_k.sum(axis=1), rtol=1e-12)


def test_reading_the_final_state_gives_noncausal_attention():
    q, k, v = random_qkv(2, 7, 3, 2)
    _, state = scan(q, k, v)
    phi_q = get_feature_map("elu+1").forward(q)
    out = (phi_q @ state.S) / (phi_q @ state.z[:, None] + 1e-6)
    np.testing.assert_allclose(out, linear_attention(q, k, v, method="quadratic"), rtol=1e-10)


def test_a_state_can_be_passed_in_as_a_plain_tuple():
    q, k, v = random_qkv(3, 2, 3, 2)
    _, state = linear_attention_step(q[0], k[0], v[0])
    out, _ = linear_attention_step(q[1], k[1], v[1], (state.S, state.z))
    want = linear_attention(q, k, v, causal=True, method="quadratic")[1]
    np.testing.assert_allclose(out, want, rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype, state_dtype", [(np.float16, np.float32),
                                                (np.float32, np.float32)])
def test_step_dtypes(backend, dtype, state_dtype):
    q, k, v = (x.astype(dtype) for x in random_qkv(4, 1, 3, 2))
    out, state = linear_attention_step(q[0], k[0], v[0], backend=backend)
    assert out.dtype == dtype and state.S.dtype == state.z.dtype == state_dtype


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d, m, lead", [(0, 3, (2,)), (3, 0, (2,)), (0, 0, (2,)), (3, 4, (0,)),
                                        (3, 4, ())])
def test_step_at_empty_widths_and_leading_axes(backend, d, m, lead):
    # the kernels count rows through a non-empty width: every backend as NumPy's step
    rng = np.random.default_rng(5)
    q, k, v = rng.random((*lead, d)), rng.random((*lead, d)), rng.random((*lead, m))
    want, want_state = linear_attention_step(q, k, v, backend="numpy")
    out, state = linear_attention_step(q, k, v, backend=backend)
    assert out.shape == want.shape and state.S.shape == want_state.S.shape
    np.testing.assert_allclose(out, want, rtol=1e-12)
    np.testing.assert_allclose(state.S, want_state.S, rtol=1e-12)


@pytest.mark.parametrize("state, error, message", [
    (State(np.zeros((3, 3)), np.zeros(3)), ValueError, "S \\(3, 2\\)"),
    (State(np.zeros((3, 2)), np.zeros(2)), ValueError, "z \\(3,\\)"),
    (np.zeros((3, 2)), TypeError, "State"),
    (State(np.zeros((3, 2), int), np.zeros(3)), TypeError, "dtype"),
])
def test_bad_states(state, error, message):
    q, k, v = random_qkv(5, 1, 3, 2)
    with pytest.raises(error, match=message):
        linear_attention_step(q[0], k[0], v[0], state)


@pytest.mark.parametrize("shapes", [((3,), (4,), (2,)), ((2, 3), (3, 3), (2, 2)),
                                    ((2, 3), (2, 3), (3, 2)), ((), (), ())])
def test_bad_step_shapes(shapes):
    q, k, v = (np.ones(s) for s in shapes)
    with pytest.raises(ValueError, match="q_t"):
        linear_attention_step(q, k, v)
