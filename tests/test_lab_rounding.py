"""linattn.lab.rounding, the helpers of notebooks 09 and 11: running, chunked and
compensated sums of the RNN state, and the compensated step, compute what they say."""
import numpy as np
import pytest

import linattn
from linattn.lab import rounding


def _features(seed, n, f, m, dtype=np.float32):
    rng = np.random.default_rng(seed)
    phi_k = linattn.EluPlusOne().forward(rng.standard_normal((n, f))).astype(dtype)
    return phi_k, rng.standard_normal((n, m)).astype(dtype)


def _sequential(phi_k, v, at, dtype):
    """The running sums by a plain Python loop, one position at a time."""
    s, z, out = np.zeros((phi_k.shape[1], v.shape[1]), dtype), np.zeros(phi_k.shape[1], dtype), []
    for i in range(at[-1]):
        s = s + np.outer(phi_k[i], v[i]).astype(dtype)
        z = z + phi_k[i].astype(dtype)
        if i + 1 in at:
            out.append((s, z))
    return np.array([a for a, _ in out]), np.array([b for _, b in out])


@pytest.mark.parametrize("block", [1, 7, 4096])
def test_running_states_are_the_sequential_sums(block):
    phi_k, v = _features(0, 300, 3, 2)
    at = [1, 64, 100, 300]
    s, z = rounding.running_states(phi_k, v, at, np.float32, block=block)
    want_s, want_z = _sequential(phi_k, v, at, np.float32)
    np.testing.assert_array_equal(s, want_s)           # the same additions in the same order
    np.testing.assert_array_equal(z, want_z)


def test_library_step_adds_what_running_states_adds():
    phi_k, v = _features(1, 200, 4, 3)
    state = None
    for i in range(200):
        _, state = linattn.linear_attention_step(phi_k[i], phi_k[i], v[i], state,
                                                 feature_map=rounding.Identity(),
                                                 backend="numpy")
    s, z = rounding.running_states(phi_k, v, [200], np.float32)
    np.testing.assert_allclose(state.S, s[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(state.z, z[0], rtol=1e-6)


def test_chunked_states_sum_the_same_terms():
    phi_k, v = _features(2, 640, 3, 2, np.float64)
    at = rounding.checkpoints(640, count=5, multiple=64, start=64)
    assert np.all(at % 64 == 0) and at[-1] == 640
    s, z = rounding.chunked_states(phi_k, v, at, np.float64, chunk_size=64)
    want_s, want_z = _sequential(phi_k, v, list(at), np.float64)
    np.testing.assert_allclose(s, want_s, rtol=1e-12)
    np.testing.assert_allclose(z, want_z, rtol=1e-12)


def test_relative_error_per_row():
    want = np.array([[[1.0, 0.0]], [[0.0, 2.0]]])
    got = want + np.array([[[0.1, 0.0]], [[0.0, 0.0]]])
    np.testing.assert_allclose(rounding.relative_error(got, want), [0.1, 0.0])


@pytest.mark.slow
def test_compensated_states_stay_within_a_few_ulps():
    phi_k, v = _features(3, 50_000, 3, 2)
    at = np.array([100, 10_000, 50_000])
    s64, z64 = rounding.running_states(phi_k, v, at, np.float64)
    s, z = rounding.compensated_states(phi_k, v, at, np.float32)
    plain, _ = rounding.running_states(phi_k, v, at, np.float32)
    u = np.finfo(np.float32).eps / 2
    assert s.dtype == np.float32
    assert np.all(rounding.relative_error(s, s64) < 5 * u)
    assert np.all(rounding.relative_error(z, z64) < 5 * u)
    assert rounding.relative_error(s, s64)[-1] < rounding.relative_error(plain, s64)[-1] / 5


@pytest.mark.slow
def test_compensated_states_reject_bad_counts():
    phi_k, v = _features(4, 10, 2, 2)
    for at in ([11], [5, 5], [0, 3]):
        with pytest.raises(ValueError, match="increasing counts"):
            rounding.compensated_states(phi_k, v, at, np.float32)
    with pytest.raises(ValueError):
        rounding.compensated_states(phi_k, v[:5], [5], np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kahan_step_is_the_library_step(dtype):
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((3, 20, 4, 3)) * 2).astype(dtype)   # (3, N, R, D)
    state = None
    kahan = tuple(np.zeros(shape, dtype) for shape in ((4, 3, 3), (4, 3), (4, 3, 3), (4, 3)))
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    for i in range(20):
        out, state = linattn.linear_attention_step(q[i], k[i], v[i], state, backend="numpy")
        out_kahan, kahan = rounding.kahan_step(q[i], k[i], v[i], kahan)
        np.testing.assert_allclose(out_kahan, out, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(kahan[0] - kahan[2], state.S, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(kahan[1], state.z, rtol=rtol)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_library_option_is_the_helpers_kahan_step(dtype):
    # compensated=True adds by the same operations in the same order, with the same elu+1
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((3, 50, 4, 3)) * 2).astype(dtype)   # (3, N, R, D)
    rnn = linattn.Recurrence((4,), 3, 3, dtype=dtype, backend="numba", compensated=True)
    kahan = tuple(np.zeros(shape, dtype) for shape in ((4, 3, 3), (4, 3), (4, 3, 3), (4, 3)))
    for i in range(50):
        out = rnn.step(q[i], k[i], v[i])
        out_kahan, kahan = rounding.kahan_step(q[i], k[i], v[i], kahan)
        np.testing.assert_array_equal(out, out_kahan)
    for got, want in zip(rnn.state, kahan):
        np.testing.assert_array_equal(got, want)
