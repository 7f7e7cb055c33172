"""Exercise solutions and checks for notebook 06, feature maps.

Katharopoulos et al. (2020), arXiv:2006.16236, section 3.2.1: phi(x) = elu(x) + 1, Eq. (7),
chosen over relu because relu's gradient is 0 for negative inputs.

1. ``elu_plus_one`` and ``elu_plus_one_vjp``: Eq. (7) and its backward pass.
2. ``taylor_features``: the degree-2 Taylor map [1, x, vec(x x^T) / sqrt(2)] on (..., D).
3. ``Softplus``: a feature map object, phi(x) = log(1 + e^x), positive with a gradient that
   is never 0, used through ``feature_map=`` of the library.

Each ``check_exercise_N(fn)`` prints the verdict and returns True when fn is right (False
while it raises NotImplementedError); a wrong answer fails an assertion.
"""
import numpy as np

import linattn

from checks._exercises import attempter

_attempt = attempter(__file__)


def elu_plus_one(x):
    """Exercise 1a: elu(x) + 1 = x + 1 for x > 0, exp(x) otherwise."""
    return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))


def elu_plus_one_vjp(x, dphi):
    """Exercise 1b: dx = dphi * phi'(x), phi'(x) = 1 for x > 0, exp(x) otherwise."""
    return dphi * np.where(x > 0, 1.0, np.exp(np.minimum(x, 0)))


def taylor_features(x):
    """Exercise 2: (..., D) -> (..., 1 + D + D^2), [1, x, vec(x x^T) / sqrt(2)]."""
    outer = x[..., :, None] * x[..., None, :] / np.sqrt(2)           # (..., D, D)
    ones = np.ones((*x.shape[:-1], 1), dtype=x.dtype)
    return np.concatenate([ones, x, outer.reshape(*x.shape[:-1], -1)], axis=-1)


class Softplus:
    """Exercise 3: phi(x) = log(1 + e^x), and its backward pass phi'(x) = 1 / (1 + e^-x)."""

    def forward(self, x):
        return np.logaddexp(0, x)                     # log(e^0 + e^x), without overflow

    def vjp(self, x, dphi):
        return dphi / (1 + np.exp(-x))



def check_exercise_1(forward, vjp):
    """True when forward and vjp are elu+1 and its vector-Jacobian product."""
    rng = np.random.default_rng(0)
    x, dphi = rng.standard_normal((2, 5, 7)) * 3
    got = _attempt(1, forward, x)
    if got is None:
        return False
    phi = linattn.EluPlusOne()
    np.testing.assert_allclose(got, phi.forward(x), rtol=1e-12)
    assert np.all(got > 0), "elu + 1 is positive everywhere"
    np.testing.assert_allclose(_attempt(1, vjp, x, dphi), phi.vjp(x, dphi), rtol=1e-12)
    print("exercise 1: right")
    return True


def check_exercise_2(fn):
    """True when fn is the Taylor feature map on any leading axes."""
    x = np.random.default_rng(1).standard_normal((2, 3, 4))
    got = _attempt(2, fn, x)
    if got is None:
        return False
    np.testing.assert_allclose(got, linattn.Taylor().forward(x), rtol=1e-12)
    s = np.sum(x[0, 0] * x[1, 2])                                     # its kernel: 1 + s + s^2/2
    np.testing.assert_allclose(got[0, 0] @ got[1, 2], 1 + s + s * s / 2, rtol=1e-12)
    print("exercise 2: right")
    return True


def check_exercise_3(feature_map):
    """True when ``feature_map`` (an object) is softplus with a right vjp: its features,
    and the library's linear_attention_backward through it against central differences."""
    x = np.linspace(-30, 30, 61)
    got = _attempt(3, feature_map.forward, x)
    if got is None:
        return False
    np.testing.assert_allclose(got, np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0), rtol=1e-12)
    rng = np.random.default_rng(3)
    q, k, v, dout = rng.standard_normal((4, 5, 3))
    grads = linattn.linear_attention_backward(dout, q, k, v, causal=True,
                                              feature_map=feature_map)
    h = 1e-6
    for g, which in zip(grads, range(3)):
        args = [q, k, v]
        for idx in np.ndindex(args[which].shape):
            plus, minus = [a.copy() for a in args], [a.copy() for a in args]
            plus[which][idx] += h
            minus[which][idx] -= h
            diff = np.sum((linattn.linear_attention(*plus, causal=True, feature_map=feature_map)
                           - linattn.linear_attention(*minus, causal=True,
                                                      feature_map=feature_map)) * dout) / (2 * h)
            np.testing.assert_allclose(g[idx], diff, rtol=1e-5, atol=1e-8)
    assert np.all(feature_map.vjp(x, np.ones_like(x)) > 0), "softplus' slope is never 0"
    print("exercise 3: right: the library's backward through it matches central differences")
    return True
