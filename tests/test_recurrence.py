"""linattn.Recurrence, the RNN of Eq. (16)-(20) with its state kept in place: stepping it gives
what scanning the functional linear_attention_step gives (its reference), on every backend
and feature map, plain and compensated; its state is a snapshot; bad input is a clear error
that leaves the state untouched."""
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

from linattn import (CompensatedState, Recurrence, State, linear_attention,
                     linear_attention_step)
from linattn.feature_maps import get_feature_map

from helpers import FEATURE_MAP_NAMES, random_qkv, relative_error
from test_cuda_cpu import fake_cupy
from test_linear import BACKENDS, feature_map
from test_recurrent import scan as scan_functional   # linear_attention_step over positions

leads = st.sampled_from([(), (2,), (2, 3)])


def scan_recurrence(rnn, q, k, v):
    """rnn.step over positions: the outputs (..., N, M)."""
    return np.stack([rnn.step(q[..., i, :], k[..., i, :], v[..., i, :])
                     for i in range(q.shape[-2])], axis=-2)


@pytest.mark.parametrize("backend", BACKENDS)
@given(n=st.integers(1, 12), d=st.integers(1, 5), m=st.integers(1, 5), lead=leads,
       fmap=st.sampled_from(FEATURE_MAP_NAMES), compensated=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_steps_equal_the_functional_scan(backend, n, d, m, lead, fmap, compensated, seed):
    q, k, v = random_qkv(seed, n, d, m, lead)
    kw = dict(feature_map=feature_map(fmap), backend=backend)
    rnn = Recurrence(lead, d, m, dtype="float64", compensated=compensated, **kw)
    got = scan_recurrence(rnn, q, k, v)
    want, want_state = scan_functional(q, k, v, compensated=compensated, **kw)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert type(rnn.state) is type(want_state)
    for g, w in zip(rnn.state, want_state):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    causal = linear_attention(q, k, v, causal=True, method="quadratic",
                              feature_map=feature_map(fmap))
    np.testing.assert_allclose(got, causal, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("compensated", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numba_state_equals_numpy_bit_for_bit(dtype, compensated):
    # the same additions in the same order: S, z (and S_c, z_c) equal exactly, given the
    # same features (relu, applied by NumPy for both; Numba's fused elu+1 has its own exp)
    q, k, v = (x.astype(dtype) for x in random_qkv(7, 300, 6, 5, (2,)))
    rnns = [Recurrence((2,), 6, 5, dtype=dtype, backend=b, compensated=compensated,
                       feature_map="relu") for b in ("numpy", "numba")]
    outs = [scan_recurrence(rnn, q, k, v) for rnn in rnns]
    for a, b in zip(*(rnn.state for rnn in rnns)):
        np.testing.assert_array_equal(a, b)
    # the readouts sum in another order (NumPy's matmul): close, relative to the largest
    assert relative_error(outs[1], outs[0]) < (1e-6 if dtype == np.float32 else 1e-14)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_state_is_a_snapshot_and_reset_zeroes_it(backend):
    q, k, v = random_qkv(1, 3, 4, 3, (2,))
    rnn = Recurrence((2,), 4, 3, dtype=np.float64, backend=backend)
    first = rnn.step(q[:, 0], k[:, 0], v[:, 0])
    snapshot = rnn.state
    assert isinstance(snapshot, State) and snapshot.S.shape == (2, 4, 3)
    second = rnn.step(q[:, 1], k[:, 1], v[:, 1])
    assert second is not first and not np.shares_memory(first, second)
    _, want = linear_attention_step(q[:, 0], k[:, 0], v[:, 0], backend=backend)
    for g, w in zip(snapshot, want):                 # later steps left the snapshot alone
        np.testing.assert_array_equal(g, w)
    snapshot.S[...] = 1e9                             # and the snapshot is not the state
    out, _ = linear_attention_step(q[:, 2], k[:, 2], v[:, 2], rnn.state, backend=backend)
    np.testing.assert_allclose(rnn.step(q[:, 2], k[:, 2], v[:, 2]), out, rtol=1e-12)
    rnn.reset()
    assert not any(a.any() for a in rnn.state)
    np.testing.assert_allclose(rnn.step(q[:, 0], k[:, 0], v[:, 0]), first, rtol=1e-12)


def test_a_snapshot_continues_in_the_functional_step():
    q, k, v = random_qkv(2, 6, 3, 2)
    rnn = Recurrence((), 3, 2, dtype="float64", compensated=True)
    scan_recurrence(rnn, q[:4], k[:4], v[:4])
    state = rnn.state
    assert isinstance(state, CompensatedState)
    for i in (4, 5):
        out, state = linear_attention_step(q[i], k[i], v[i], state, compensated=True)
        np.testing.assert_array_equal(rnn.step(q[i], k[i], v[i]), out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_inputs_and_float32(backend):
    q, k, v = (x.astype(np.float32) for x in random_qkv(3, 9, 4, 5, (3,)))
    rnn = Recurrence((3,), 4, 5, backend=backend)          # float32 by default
    views = [rnn.step(q[:, i], k[:, i], v[:, i]) for i in range(9)]     # strided rows
    contiguous = Recurrence((3,), 4, 5, backend=backend)
    rows = [contiguous.step(*(np.ascontiguousarray(x[:, i]) for x in (q, k, v)))
            for i in range(9)]
    np.testing.assert_array_equal(np.stack(views), np.stack(rows))
    assert views[0].dtype == np.float32
    want = linear_attention(*(x.astype(np.float64) for x in (q, k, v)), causal=True)
    np.testing.assert_allclose(np.stack(views, axis=1), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_stays_in_its_row(backend):
    q, k, v = random_qkv(4, 3, 3, 2, (3,))
    rnn = Recurrence((3,), 3, 2, dtype="float64", backend=backend)
    q[0, 0, 1] = np.nan                        # row 0's query: only its output, this step
    k[1, 0, 2] = np.nan                        # row 1's key: its state, from now on
    outs = scan_recurrence(rnn, q, k, v)
    assert np.isnan(outs[0, 0]).all() and np.isfinite(outs[0, 1:]).all()
    assert np.isnan(outs[1]).all() and np.isfinite(outs[2]).all()


def test_subclasses_pass_as_their_base_class():
    class Tagged(np.ndarray):
        pass
    q, k, v = random_qkv(5, 1, 3, 2)
    rnn = Recurrence((), 3, 2, dtype="float64")
    out = rnn.step(q[0].view(Tagged), k[0], v[0])
    np.testing.assert_array_equal(out, linear_attention_step(q[0], k[0], v[0])[0])


# --- a compensated float32 state against float64 ----------------------------------------

U32 = 2.0**-24          # float32's unit roundoff


def error_in_u(got, want):
    """||got - want||_F / ||want||_F in units of float32's u = 2^-24: the relative error of a
    whole state, as notebook 09 measures it."""
    return np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want) / U32


def test_compensated_float32_state_stays_at_float64_over_1e5_steps():
    # elu+1 features of standard normal q, k in float32, D = M = 8: the plain float32 sum
    # drifts like u sqrt(N); the compensated one stays within a few u of the float64 sum of
    # the same float32 features
    n, d = 10**5, 8
    q, k, v = (x.astype(np.float32) for x in random_qkv(11, n, d, d))
    plain, compensated = (Recurrence((), d, d, backend="numba", compensated=c)
                          for c in (False, True))
    for i in range(n):
        plain.step(q[i], k[i], v[i])
        compensated.step(q[i], k[i], v[i])
    phi_k = get_feature_map("elu+1").forward(k).astype(np.float64)
    s64, z64 = phi_k.T @ v.astype(np.float64), phi_k.sum(axis=0)     # float64 sums
    errors = {name: (error_in_u(rnn.state.S, s64), error_in_u(rnn.state.z, z64))
              for name, rnn in (("plain", plain), ("compensated", compensated))}
    assert max(errors["compensated"]) < 5, errors
    assert min(errors["plain"]) > 10 * max(errors["compensated"]), errors   # can fail


# --- bad input ---------------------------------------------------------------------------

@pytest.mark.parametrize("args, kw, error, message", [
    (("8", 4, 4), {}, TypeError, "lead_shape"),
    (((2, -1), 4, 4), {}, ValueError, "lead_shape entry"),
    (((2.5,), 4, 4), {}, TypeError, "lead_shape entry"),
    (((2,), 0, 4), {}, ValueError, "d must be at least 1"),
    (((2,), 4, -1), {}, ValueError, "m must be at least 0"),
    (((2,), 4, 4), dict(dtype="float16"), TypeError, "float32 or float64"),
    (((2,), 4, 4), dict(dtype="int32"), TypeError, "float32 or float64"),
    (((2,), 4, 4), dict(dtype="nonsense"), TypeError, "float32 or float64"),
    (((2,), 4, 4), dict(eps=-1.0), ValueError, "eps"),
    (((2,), 4, 4), dict(compensated="yes"), TypeError, "compensated must be True or False"),
    (((2,), 4, 4), dict(backend="gpu"), ValueError, "unknown backend"),
    (((2,), 4, 4), dict(feature_map="softmax"), ValueError, "unknown feature map"),
])
def test_bad_constructor_arguments(args, kw, error, message):
    with pytest.raises(error, match=message):
        Recurrence(*args, **kw)


@pytest.mark.parametrize("module, error, message", [
    (None, ImportError, "needs CuPy, which is not installed"),
    (fake_cupy(0), RuntimeError, "needs an NVIDIA GPU"),
])
def test_cupy_backend_says_what_is_missing(monkeypatch, module, error, message):
    monkeypatch.setitem(sys.modules, "cupy", module)
    with pytest.raises(error, match=message):
        Recurrence((2,), 4, 4, backend="cupy")


def test_auto_stays_on_the_cpu():
    assert Recurrence((2,), 4, 4).backend == "numba"
    assert Recurrence((2,), 4, 4, backend="numpy").backend == "numpy"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("which, value, error, message", [
    (0, np.ones((2, 5), np.float32), ValueError, "q_t must have shape \\(2, 4\\)"),
    (1, np.ones((4,), np.float32), ValueError, "k_t must have shape \\(2, 4\\)"),
    (2, np.ones((2, 4), np.float32), ValueError, "v_t must have shape \\(2, 3\\)"),
    (0, np.ones((2, 4), np.float64), TypeError, "q_t must have dtype float32"),
    (2, np.ones((2, 3), np.int32), TypeError, "v_t must have dtype float32"),
    (1, [[1.0] * 4] * 2, TypeError, "k_t must be a numpy.ndarray"),
])
def test_bad_steps_are_errors_that_leave_the_state_alone(backend, which, value, error,
                                                          message):
    rnn = Recurrence((2,), 4, 3, backend=backend)
    good = [np.ones((2, 4), np.float32), np.ones((2, 4), np.float32),
            np.ones((2, 3), np.float32)]
    rnn.step(*good)
    before = rnn.state
    args = list(good)
    args[which] = value
    with pytest.raises(error, match=message):
        rnn.step(*args)
    for a, b in zip(rnn.state, before):
        np.testing.assert_array_equal(a, b)


def test_plain_and_compensated_states_do_not_mix():
    q, k, v = random_qkv(6, 2, 3, 2)
    out, plain = linear_attention_step(q[0], k[0], v[0])
    _, compensated = linear_attention_step(q[0], k[0], v[0], compensated=True)
    assert isinstance(compensated, CompensatedState) and isinstance(plain, State)
    np.testing.assert_array_equal(compensated.S, plain.S)     # no rounding lost yet
    with pytest.raises(TypeError, match="no compensation terms"):
        linear_attention_step(q[1], k[1], v[1], plain, compensated=True)
    with pytest.raises(TypeError, match="pass compensated=True"):
        linear_attention_step(q[1], k[1], v[1], compensated)
    with pytest.raises(ValueError, match="S_c \\(3, 2\\)"):
        linear_attention_step(q[1], k[1], v[1], compensated._replace(S_c=np.zeros((2, 2))),
                              compensated=True)
    with pytest.raises(TypeError, match="compensated must be True or False"):
        linear_attention_step(q[1], k[1], v[1], compensated=1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_compensated_step_keeps_its_input_state(backend):
    q, k, v = random_qkv(8, 2, 3, 2)
    _, state = linear_attention_step(q[0], k[0], v[0], compensated=True, backend=backend)
    copies = [a.copy() for a in state]
    linear_attention_step(q[1], k[1], v[1], state, compensated=True, backend=backend)
    for a, b in zip(state, copies):
        np.testing.assert_array_equal(a, b)
