"""Exercises of notebook 01 (softmax attention): our solutions and the checks.

Each ``check_exercise_N(answer)`` prints "Exercise N: correct" for a right answer, raises
AssertionError saying what is wrong otherwise, and prints a note while the answer still
raises NotImplementedError (the notebook's starting point).
"""
import numpy as np

import linattn
from linattn.lab.bench.timing import peak_bytes

from checks._exercises import report as _report



# ---- Exercise 1: the slopes of causal softmax attention ------------------------------------

# Causal attention computes half of the N^2 pairs: half the time at every N, a log-log line
# shifted down by log 2, the same slope. NumPy still holds the N x N matrices (the masked
# logits are -inf, not absent); Numba still holds a few tiles of logits at a time.
PREDICTED_SLOPES = {"numpy": {"time": 2.0, "memory": 2.0},
                    "numba": {"time": 2.0, "memory": 1.0}}

_WHY = {("numpy", "time"): "every query still meets up to N keys: about N^2 / 2 pairs, and "
                           "halving the work at every N does not change the slope",
        ("numba", "time"): "the compiled loops skip the pairs j > i: N^2 / 2 pairs, still N^2",
        ("numpy", "memory"): "the NumPy backend builds the full N x N logits and masks them "
                             "with -inf; nothing is saved",
        ("numba", "memory"): "the Numba kernel holds a few tiles of logits at a time, "
                             "whatever N"}


def causal_memory_slopes(ns=(1024, 2048, 4096), d=64):
    """Measured log-log slopes of the peak memory of causal softmax attention against N,
    {backend: slope}, float32, D = M = d; tracemalloc counts bytes exactly, so no noise."""
    rng = np.random.default_rng(0)
    slopes = {}
    for backend in ("numpy", "numba"):
        peaks = []
        for n in ns:
            q, k, v = rng.standard_normal((3, n, d)).astype(np.float32)
            call = lambda: linattn.softmax_attention(q, k, v, causal=True, backend=backend)
            call()                                     # the first call may compile: not counted
            peaks.append(peak_bytes(call))
        slopes[backend] = float(np.polyfit(np.log(ns), np.log(peaks), 1)[0])
    return slopes


def _check_1(predicted):
    for backend, quantities in PREDICTED_SLOPES.items():
        for quantity, slope in quantities.items():
            guess = predicted[backend][quantity]
            if guess is None:
                raise NotImplementedError
            assert abs(guess - slope) <= 0.25, (
                f"{quantity} on backend={backend!r}: you predicted {guess}; think again: "
                f"{_WHY[backend, quantity]}")
    measured = causal_memory_slopes()
    for backend, slope in measured.items():
        print(f"measured memory slope, causal, backend={backend!r}: {slope:.2f}")
        assert abs(slope - PREDICTED_SLOPES[backend]["memory"]) < 0.2, (backend, slope)


def check_exercise_1(predicted_slopes):
    """predicted_slopes: {"numpy": {"time": t, "memory": m}, "numba": {...}}."""
    return _report(1, _check_1, predicted_slopes)


# ---- Exercise 2: a softmax that never overflows ---------------------------------------------

def stable_softmax(logits):
    """Softmax along the last axis with each row's maximum subtracted first: every exponent
    is <= 0 and the largest term is exp(0) = 1, so nothing overflows and no row sums to 0."""
    top = np.max(logits, axis=-1, keepdims=True)
    weights = np.exp(logits - top)                     # in (0, 1]; exp(-inf) = 0: masked
    return weights / np.sum(weights, axis=-1, keepdims=True)


def _reference(logits):
    """Softmax in float64 with the maximum subtracted: the value a float32 answer must match."""
    x = np.asarray(logits, dtype=np.float64)
    weights = np.exp(x - x.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


def _check_2(softmax):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 7))
    got = softmax(x)
    assert got.shape == x.shape, f"shape {got.shape}, want {x.shape}: softmax keeps the shape"
    np.testing.assert_allclose(got, np.exp(x) / np.exp(x).sum(-1, keepdims=True), rtol=1e-12,
                               err_msg="small float64 logits: not the softmax of the last axis")
    big = (300 * rng.standard_normal((6, 9))).astype(np.float32)
    big[0] -= 3000                                     # a row of very negative logits
    got = softmax(big)
    assert got.dtype == np.float32, f"float32 logits gave {got.dtype}: keep float32"
    assert np.all(np.isfinite(got)), ("large float32 logits gave inf or NaN: exp overflowed "
                                      "(or a row underflowed to 0 / 0)")
    np.testing.assert_allclose(got, _reference(big), rtol=1e-5, atol=1e-7,
                               err_msg="large float32 logits: wrong values")
    masked = x.copy()
    masked[..., 2] = -np.inf                           # key 2 hidden from every query
    got = softmax(masked)
    assert np.all(got[..., 2] == 0), "a logit of -inf must get weight exactly 0"
    np.testing.assert_allclose(got, _reference(masked), rtol=1e-12,
                               err_msg="with -inf entries: wrong values")


def check_exercise_2(stable_softmax):
    """stable_softmax(logits) -> weights, softmax along the last axis."""
    return _report(2, _check_2, stable_softmax)


# ---- Exercise 3: softmax attention by hand ---------------------------------------------------

def softmax_attention_by_hand(q, k, v, causal=False):
    """softmax(q k^T / sqrt(D)) v, Eq. (2), and with causal the mask of Eq. (8)."""
    logits = q @ np.swapaxes(k, -1, -2) * q.shape[-1] ** -0.5      # (..., N, N)
    if causal:
        n = logits.shape[-1]
        logits = np.where(np.tril(np.ones((n, n), dtype=bool)), logits, -np.inf)
    return stable_softmax(logits) @ v


def _check_3(attention):
    rng = np.random.default_rng(2)
    for lead in ((), (2,), (2, 3)):
        for causal in (False, True):
            for scale in (1.0, 30.0):                  # 30: logits far beyond exp's range
                q, k = scale * rng.standard_normal((2, *lead, 5, 3))
                v = rng.standard_normal((*lead, 5, 4))
                want = linattn.softmax_attention(q, k, v, causal=causal, backend="numpy")
                got = attention(q, k, v, causal=causal)
                assert got.shape == want.shape, f"shape {got.shape}, want {want.shape}"
                np.testing.assert_allclose(
                    got, want, rtol=1e-10, atol=1e-12,
                    err_msg=f"leading axes {lead}, causal={causal}, logits x{scale}")
    q, k = (40 * rng.standard_normal((2, 6, 4))).astype(np.float32)
    v = rng.standard_normal((6, 4)).astype(np.float32)
    assert np.all(np.isfinite(attention(q, k, v))), "large float32 logits gave inf or NaN"


def check_exercise_3(softmax_attention_by_hand):
    """softmax_attention_by_hand(q, k, v, causal=False) -> out (..., N, M)."""
    return _report(3, _check_3, softmax_attention_by_hand)
