"""Checks of notebook 09's exercises, rounding in the running state of Eq. (16)-(20) of
Katharopoulos et al. (2020), arXiv:2006.16236.

1. ``fn(a, b)``: Knuth's TwoSum in float32, the rounded sum and its exact rounding error.
2. ``fn(x)``: Kahan-compensated running sums of a float32 vector.

``check_exercise_N(answer)`` prints "Exercise N: correct", raises AssertionError saying what
is wrong, or says the answer is not attempted yet while it raises NotImplementedError.
"""
import numpy as np

from ._exercises import report


def _two_sum(fn):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(1000) * 10.0 ** rng.integers(-4, 5, 1000)).astype(np.float32)
    b = (rng.standard_normal(1000) * 10.0 ** rng.integers(-4, 5, 1000)).astype(np.float32)
    s, e = fn(a, b)
    s, e = np.asarray(s), np.asarray(e)
    assert s.dtype == e.dtype == np.float32, f"both in float32, got {s.dtype}, {e.dtype}"
    np.testing.assert_array_equal(s, a + b, err_msg="s is the float32 sum a + b, rounded")
    exact = a.astype(np.float64) + b.astype(np.float64)  # both sides round the same a + b once
    np.testing.assert_array_equal(s.astype(np.float64) + e.astype(np.float64), exact,
                                  err_msg="s + e must be a + b exactly: e is what rounding "
                                          "lost")


def check_exercise_1(fn):
    report(1, _two_sum, fn)


def _kahan_cumsum(fn):
    x = np.random.default_rng(2).random(10**5).astype(np.float32)
    got = np.asarray(fn(x))
    want = np.cumsum(x.astype(np.float64))
    assert got.shape == x.shape, f"one running sum per term, {x.shape}"
    assert got.dtype == np.float32, "sum in the input's dtype, float32"
    plain = abs(float(np.cumsum(x)[-1]) - want[-1]) / want[-1]
    error = abs(float(got[-1]) - want[-1]) / want[-1]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert error < plain / 10, (f"relative error {error:.1e} at 10^5 terms: not ten times "
                                f"better than np.cumsum's {plain:.1e}")


def check_exercise_2(fn):
    report(2, _kahan_cumsum, fn)
