"""The exercise solutions of notebooks 06-09 pass their checks, the checks reject wrong and
unwritten answers, and notebook 09's helpers (running, chunked and compensated sums, the
compensated step) compute what they say.

The solutions live beside the notebooks, ``notebooks/solutions/NN_name.py``, and are
imported as the notebooks import them, ``solutions.NN_name`` with ``notebooks/`` on the path
(one module name, so Numba's cache of notebook 09's helpers is found either way).
"""
import importlib
import pathlib
import sys

import numpy as np
import pytest

import linattn

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"


def load(stem):
    if str(NOTEBOOKS) not in sys.path:
        sys.path.insert(0, str(NOTEBOOKS))
    return importlib.import_module(f"solutions.{stem}")


def unwritten(*args):
    raise NotImplementedError


# (module, exercise number) -> (the solution's arguments to check_exercise_N, a wrong answer)
def _cases():
    s06 = load("06_feature_maps")
    s07, s08 = load("07_training_a_linear_transformer"), load("08_gpu_kernels")
    s09 = load("09_numerical_stability")

    class NoSlope(s06.Softplus):            # right features, vjp that forgets the slope
        def vjp(self, x, dphi):
            return dphi

    return {
        ("06", 1): (s06, (s06.elu_plus_one, s06.elu_plus_one_vjp),
                    (lambda x: np.maximum(x, 0) + 1, s06.elu_plus_one_vjp)),
        ("06", 2): (s06, (s06.taylor_features,),
                    (lambda x: linattn.Taylor().forward(x) * 1.01,)),
        ("06", 3): (s06, (s06.Softplus(),), (NoSlope(),)),
        ("07", 1): (s07, (s07.cross_entropy_grad,),
                    (lambda logits, targets, weights: s07.cross_entropy_grad(
                        logits, targets, np.ones_like(weights)),)),
        ("07", 2): (s07, (s07.adam_step,),
                    (lambda p, g, m, v, t, lr, b1, b2, eps: s07.adam_step(
                        p, g, m, v, 1, lr, b1, b2, eps),)),       # forgets t in the correction
        ("07", 3): (s07, (s07.crossover_tokens,), (lambda h, d: (d + 1) // 2,)),
        ("08", 1): (s08, (s08.reverse_exclusive_scan,),
                    (lambda x: np.cumsum(x[:, ::-1], axis=1)[:, ::-1],)),   # inclusive
        ("08", 2): (s08, (s08.tile_by_threads,), (lambda a, b, r: a.T @ b.T.T * (r == 4),)),
        ("08", 3): (s08, (s08.chunked_dv,),
                    (lambda dout, phi_q, phi_k, c: s08.chunked_dv(dout, phi_q, phi_k, c) * 0.5,)),
        ("09", 1): (s09, (s09.stable_softmax,),
                    (lambda x: np.exp(x) / np.exp(x).sum(axis=-1, keepdims=True),)),
        ("09", 2): (s09, (s09.float16_overflow_n,),
                    (lambda mean: int(s09.FLOAT16_MAX / mean),)),
        ("09", 3): (s09, (s09.kahan_cumsum,), (np.cumsum,)),
    }


CASES = _cases()


@pytest.mark.parametrize("key", CASES, ids=lambda k: f"{k[0]}-exercise-{k[1]}")
def test_solution_passes_its_check(key):
    module, solution, _ = CASES[key]
    assert getattr(module, f"check_exercise_{key[1]}")(*solution) is True


@pytest.mark.parametrize("key", CASES, ids=lambda k: f"{k[0]}-exercise-{k[1]}")
def test_check_rejects_a_wrong_answer(key):
    module, _, wrong = CASES[key]
    with np.errstate(over="ignore", invalid="ignore"), pytest.raises(AssertionError):
        getattr(module, f"check_exercise_{key[1]}")(*wrong)


@pytest.mark.parametrize("key", CASES, ids=lambda k: f"{k[0]}-exercise-{k[1]}")
def test_check_says_when_an_answer_is_not_written(key, capsys):
    module, solution, _ = CASES[key]
    if key == ("06", 3):
        class Unwritten:
            forward = vjp = staticmethod(unwritten)
        args = (Unwritten(),)
    else:
        args = (unwritten,) * len(solution)
    assert getattr(module, f"check_exercise_{key[1]}")(*args) is False
    assert "not written yet" in capsys.readouterr().out


# ---- notebook 09's helpers ---------------------------------------------------------------

@pytest.fixture(scope="module")
def helpers():
    return load("09_numerical_stability")


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
def test_running_states_are_the_sequential_sums(helpers, block):
    phi_k, v = _features(0, 300, 3, 2)
    at = [1, 64, 100, 300]
    s, z = helpers.running_states(phi_k, v, at, np.float32, block=block)
    want_s, want_z = _sequential(phi_k, v, at, np.float32)
    np.testing.assert_array_equal(s, want_s)           # the same additions in the same order
    np.testing.assert_array_equal(z, want_z)


def test_library_step_adds_what_running_states_adds(helpers):
    phi_k, v = _features(1, 200, 4, 3)
    state = None
    for i in range(200):
        _, state = linattn.linear_attention_step(phi_k[i], phi_k[i], v[i], state,
                                                 feature_map=helpers.Identity(), backend="numpy")
    s, z = helpers.running_states(phi_k, v, [200], np.float32)
    np.testing.assert_allclose(state.S, s[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(state.z, z[0], rtol=1e-6)


def test_chunked_states_sum_the_same_terms(helpers):
    phi_k, v = _features(2, 640, 3, 2, np.float64)
    at = helpers.checkpoints(640, count=5, multiple=64, start=64)
    assert np.all(at % 64 == 0) and at[-1] == 640
    s, z = helpers.chunked_states(phi_k, v, at, np.float64, chunk_size=64)
    want_s, want_z = _sequential(phi_k, v, list(at), np.float64)
    np.testing.assert_allclose(s, want_s, rtol=1e-12)
    np.testing.assert_allclose(z, want_z, rtol=1e-12)


def test_relative_error_per_row(helpers):
    want = np.array([[[1.0, 0.0]], [[0.0, 2.0]]])
    got = want + np.array([[[0.1, 0.0]], [[0.0, 0.0]]])
    np.testing.assert_allclose(helpers.relative_error(got, want), [0.1, 0.0])


@pytest.mark.slow
def test_compensated_states_stay_within_a_few_ulps(helpers):
    phi_k, v = _features(3, 50_000, 3, 2)
    at = np.array([100, 10_000, 50_000])
    s64, z64 = helpers.running_states(phi_k, v, at, np.float64)
    s, z = helpers.compensated_states(phi_k, v, at, np.float32)
    plain, _ = helpers.running_states(phi_k, v, at, np.float32)
    u = np.finfo(np.float32).eps / 2
    assert s.dtype == np.float32
    assert np.all(helpers.relative_error(s, s64) < 5 * u)
    assert np.all(helpers.relative_error(z, z64) < 5 * u)
    assert helpers.relative_error(s, s64)[-1] < helpers.relative_error(plain, s64)[-1] / 5


@pytest.mark.slow
def test_compensated_states_reject_bad_counts(helpers):
    phi_k, v = _features(4, 10, 2, 2)
    for at in ([11], [5, 5], [0, 3]):
        with pytest.raises(ValueError, match="increasing counts"):
            helpers.compensated_states(phi_k, v, at, np.float32)
    with pytest.raises(ValueError):
        helpers.compensated_states(phi_k, v[:5], [5], np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kahan_step_is_the_library_step(helpers, dtype):
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((3, 20, 4, 3)) * 2).astype(dtype)   # (3, N, R, D)
    state = None
    kahan = tuple(np.zeros(shape, dtype) for shape in ((4, 3, 3), (4, 3), (4, 3, 3), (4, 3)))
    for i in range(20):
        out, state = linattn.linear_attention_step(q[i], k[i], v[i], state, backend="numpy")
        out_kahan, kahan = helpers.kahan_step(q[i], k[i], v[i], kahan)
        rtol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(out_kahan, out, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(kahan[0] - kahan[2], state.S, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(kahan[1], state.z, rtol=rtol)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_library_option_is_the_helpers_kahan_step(helpers, dtype):
    # compensated=True adds by the same operations in the same order, with the same elu+1
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((3, 50, 4, 3)) * 2).astype(dtype)   # (3, N, R, D)
    rnn = linattn.Recurrence((4,), 3, 3, dtype=dtype, backend="numba", compensated=True)
    kahan = tuple(np.zeros(shape, dtype) for shape in ((4, 3, 3), (4, 3), (4, 3, 3), (4, 3)))
    for i in range(50):
        out = rnn.step(q[i], k[i], v[i])
        out_kahan, kahan = helpers.kahan_step(q[i], k[i], v[i], kahan)
        np.testing.assert_array_equal(out, out_kahan)
    for got, want in zip(rnn.state, kahan):
        np.testing.assert_array_equal(got, want)
