"""Checks of notebook 11's exercises, float16 and eps: the key sum z of Eq. (11) and the
normaliser of Eq. (12) of Katharopoulos et al. (2020), arXiv:2006.16236, with
phi(x) = elu(x) + 1, Eq. (7).

1. ``fn(mu)``: E[elu(k) + 1] for k ~ N(mu, 1), in closed form.
2. ``fn(mean_phi)``: the first N at which N * mean_phi passes float16's largest value.
3. ``fn()``: the float32 x below which exp(x) rounds to 0.

``check_exercise_N(answer)`` prints "Exercise N: correct", raises AssertionError saying what
is wrong, or says the answer is not attempted yet while it raises NotImplementedError.
"""
import numpy as np

from ._exercises import report

FLOAT16_MAX = float(np.finfo(np.float16).max)             # 65504


def _elu_mean(fn):
    x = np.linspace(-40.0, 40.0, 800_001)
    for mu in (-1.0, 0.0, 1.0, 2.5):
        density = np.exp(-(x - mu) ** 2 / 2) / np.sqrt(2 * np.pi)
        phi = np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))
        want = np.trapezoid(phi * density, x)                  # the integral, numerically
        got = float(fn(mu))
        assert abs(got - want) < 1e-6 * want, f"mu = {mu}: E[phi(k)] = {want:.6f}, got {got:.6f}"


def check_exercise_1(fn):
    report(1, _elu_mean, fn)


def _overflow_n(fn):
    for mean in (0.5, 1.25, 1.1605, 3.0):
        n = fn(mean)
        assert n * mean > FLOAT16_MAX >= (n - 1) * mean, \
            f"N = {n} is not the first N with N * {mean} > {FLOAT16_MAX:g}"


def check_exercise_2(fn):
    report(2, _overflow_n, fn)


def _underflow(fn):
    x = float(fn())
    below, above = np.float32(x - 0.01), np.float32(x + 0.01)
    assert np.exp(below) == 0, f"exp({float(below):.3f}) is {np.exp(below)} in float32, not 0"
    assert np.exp(above) > 0, f"exp({float(above):.3f}) already rounds to 0 in float32"


def check_exercise_3(fn):
    report(3, _underflow, fn)
