"""Checks of the exercises of notebook 01 (softmax attention). Each ``check_exercise_N``
prints "Exercise N: correct", raises AssertionError saying what is wrong, or says the
exercise is not attempted yet while the answer raises NotImplementedError."""
import numpy as np

import linattn
from linattn.lab.bench.timing import one_thread, peak_bytes
from linattn.lab.figures import growth

from ._exercises import assert_below_n_by_n, report


# ---- Exercise 1: the slopes of causal softmax attention ------------------------------------

_SLOPES = {"numpy": {"time": 2.0, "memory": 2.0}, "numba": {"time": 2.0, "memory": 1.0}}
_WHY = {("numpy", "time"): "the NumPy backend computes all N^2 logits and then masks them: "
                           "the same work as without the mask",
        ("numba", "time"): "the compiled loops skip the pairs j > i: about N^2 / 2 pairs, half "
                           "the multiply-adds once N is well above one tile (80 queries, 256 "
                           "with the larger tiles), a constant factor that leaves the log-log "
                           "slope at 2",
        ("numpy", "memory"): "the NumPy backend builds the full N x N logits and masks them "
                             "with -inf; nothing is saved",
        ("numba", "memory"): "the Numba kernel holds a few tiles of logits at a time, "
                             "whatever N, but its output and per-row log-sum-exp grow like "
                             "N: slope 1"}


def causal_memory_slopes(ns=(1024, 2048, 4096), d=64):
    """Measured growth of the peak memory of causal softmax attention against N,
    {backend: s} for a peak c + a N^s (``linattn.lab.figures.growth``: the part that does
    not grow, such as the kernel's scratch tiles, drops out), float32, D = M = d. On one
    thread: with several, the peak holds as many scratch sets as units happen to run at once,
    which varies from call to call; on one, tracemalloc's counts repeat exactly."""
    rng = np.random.default_rng(0)
    slopes = {}
    with one_thread():
        for backend in ("numpy", "numba"):
            slopes[backend] = _growth(rng, backend, ns, d)
    return slopes


def _growth(rng, backend, ns, d):
    """The growth exponent of one backend's peak over ``ns``."""
    peaks = []
    for n in ns:
        q, k, v = rng.standard_normal((3, n, d)).astype(np.float32)
        call = lambda: linattn.softmax_attention(q, k, v, causal=True, backend=backend)
        call()                                         # the first call may compile: not counted
        peaks.append(peak_bytes(call))
    return growth(ns, peaks)


def _check_1(predicted_slopes):
    predicted = predicted_slopes()
    for backend, quantities in _SLOPES.items():
        for quantity, slope in quantities.items():
            guess = predicted[backend][quantity]
            assert abs(guess - slope) <= 0.25, (
                f"{quantity} on backend={backend!r}: you predicted {guess}; think again: "
                f"{_WHY[backend, quantity]}")
    for backend, slope in causal_memory_slopes().items():
        print(f"measured memory growth, causal, backend={backend!r}: N^{slope:.2f}")
        assert abs(slope - _SLOPES[backend]["memory"]) < 0.2, (backend, slope)


def check_exercise_1(predicted_slopes):
    """predicted_slopes() -> {"numpy": {"time": t, "memory": m}, "numba": {...}}."""
    return report(1, _check_1, predicted_slopes)


# ---- Exercise 2: merging two partial softmaxes ----------------------------------------------

def _part(logits, v):
    """(m, l, o) of one block of keys: the row maximum, sum_j exp(L_ij - m_i) and
    sum_j exp(L_ij - m_i) v_j."""
    m = logits.max(axis=-1)
    w = np.exp(logits - m[..., None])
    return m, w.sum(axis=-1), w @ v


def _check_2(merge):
    rng = np.random.default_rng(3)
    for scale, split in ((1.0, 3), (1.0, 1), (1000.0, 4), (1000.0, 6)):
        # 5 queries, 7 keys; x1000: logits far past 709.8, where float64's exp overflows
        logits = scale * rng.standard_normal((5, 7))
        v = rng.standard_normal((7, 2))
        a, b = _part(logits[:, :split], v[:split]), _part(logits[:, split:], v[split:])
        with np.errstate(over="ignore", invalid="ignore"):
            m, l, o = merge(a, b)
        top = logits.max(axis=-1)
        p = np.exp(logits - top[:, None])
        want = (p / p.sum(axis=-1, keepdims=True)) @ v
        assert np.all(np.isfinite(m)) and np.all(np.isfinite(l)) and np.all(np.isfinite(o)), (
            f"logits x{scale}: inf or NaN; rescale both parts to the larger maximum, so that "
            "every factor exp(m_part - m) is at most 1")
        np.testing.assert_allclose(m, top, err_msg="m must be the maximum over all the keys")
        np.testing.assert_allclose(
            o / l[:, None], want, rtol=1e-10, atol=1e-12,
            err_msg=f"logits x{scale}, split after key {split}: o / l is not the softmax "
                    "average over both parts; each part's l and o were scaled by exp(-m_part)")
        np.testing.assert_allclose(l, p.sum(axis=-1), rtol=1e-10,
                                   err_msg="l must be sum_j exp(L_ij - m_i) over both parts")


def check_exercise_2(merge):
    """merge((m_a, l_a, o_a), (m_b, l_b, o_b)) -> (m, l, o)."""
    return report(2, _check_2, merge)


# ---- Exercise 3: softmax attention in tiles of keys -----------------------------------------

def _check_3(attention):
    rng = np.random.default_rng(2)
    for lead, n_q, n_k, tile in (((), 5, 9, 4), ((2,), 6, 6, 1), ((2, 3), 4, 7, 16)):
        for scale in (1.0, 30.0):                    # 30: logits far beyond exp's range
            q = scale * rng.standard_normal((*lead, n_q, 3))
            k = scale * rng.standard_normal((*lead, n_k, 3))
            v = rng.standard_normal((*lead, n_k, 2))
            want = linattn.softmax_attention(q, k, v, backend="numpy")
            got = attention(q, k, v, tile)
            assert got.shape == want.shape, f"shape {got.shape}, want {want.shape}"
            np.testing.assert_allclose(
                got, want, rtol=1e-10, atol=1e-12,
                err_msg=f"leading axes {lead}, Nq = {n_q}, Nk = {n_k}, tile = {tile}, "
                        f"logits x{scale}")
    n, tile = 4096, 64
    q, k, v = rng.standard_normal((3, n, 16))
    assert_below_n_by_n(lambda: attention(q, k, v, tile), n, ", tile = 64", 1 / 2,
                        "the peak memory is that of an N x N array: work through "
                        "the keys one tile at a time")


def check_exercise_3(softmax_attention_tiled):
    """softmax_attention_tiled(q, k, v, tile) -> out (..., Nq, M)."""
    return report(3, _check_3, softmax_attention_tiled)
