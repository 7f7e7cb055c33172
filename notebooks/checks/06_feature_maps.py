"""Checks of notebook 06's exercises, feature maps (Katharopoulos et al., 2020,
arXiv:2006.16236, section 3.2.1: phi(x) = elu(x) + 1, Eq. (7)).

1. ``forward, vjp``: elu + 1 and its backward pass.
2. ``fn``: a degree-3 Taylor feature map, whose kernel is 1 + s + s^2/2 + s^3/6, s = q.k.
3. ``feature_map``: softplus as a feature map object, run through the library's backward.

``check_exercise_N(answer)`` prints "Exercise N: correct", raises AssertionError saying what
is wrong, or says the answer is not attempted yet while it raises NotImplementedError.
"""
import numpy as np

import linattn

from ._exercises import report


def _elu_plus_one(forward, vjp):
    rng = np.random.default_rng(0)
    x, dphi = rng.standard_normal((2, 5, 7)) * 3
    phi = linattn.EluPlusOne()
    got = forward(x)
    assert np.shape(got) == x.shape, f"phi(x) must have x's shape {x.shape}, got {np.shape(got)}"
    np.testing.assert_allclose(got, phi.forward(x), rtol=1e-12,
                               err_msg="phi(x) = x + 1 for x > 0, exp(x) otherwise")
    np.testing.assert_allclose(vjp(x, dphi), phi.vjp(x, dphi), rtol=1e-12,
                               err_msg="dx = dphi * phi'(x), phi'(x) = 1 for x > 0, exp(x) "
                                       "otherwise")


def check_exercise_1(forward, vjp):
    report(1, _elu_plus_one, forward, vjp)


def _taylor3(fn):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4)) * 0.7
    got = fn(x)
    d = x.shape[-1]
    assert np.shape(got) == (2, 3, 1 + d + d**2 + d**3), \
        f"(..., D) -> (..., 1 + D + D^2 + D^3) = (2, 3, {1 + d + d**2 + d**3}), got {np.shape(got)}"
    np.testing.assert_allclose(got[..., :1 + d + d * d], linattn.Taylor().forward(x),
                               rtol=1e-12, err_msg="the first 1 + D + D^2 features are the "
                                                   "degree-2 map's")
    for (a, b), (c, e) in (((0, 0), (1, 2)), ((0, 1), (0, 1)), ((1, 0), (0, 2))):
        s = x[a, b] @ x[c, e]
        np.testing.assert_allclose(got[a, b] @ got[c, e], 1 + s + s**2 / 2 + s**3 / 6,
                                   rtol=1e-12, err_msg="phi(q).phi(k) must be "
                                                       "1 + s + s^2/2 + s^3/6, s = q.k")


def check_exercise_2(fn):
    report(2, _taylor3, fn)


def _softplus(feature_map):
    x = np.linspace(-30, 30, 61)
    with np.errstate(over="raise"):
        got = feature_map.forward(np.array([1000.0]))
    np.testing.assert_allclose(got, [1000.0], err_msg="log(1 + e^x) = x for large x, "
                                                      "without overflow")
    np.testing.assert_allclose(feature_map.forward(x),
                               np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0), rtol=1e-12,
                               err_msg="phi(x) = log(1 + e^x)")
    slope = feature_map.vjp(x, np.ones_like(x))
    np.testing.assert_allclose(slope, 1 / (1 + np.exp(-x)), rtol=1e-12,
                               err_msg="vjp(x, 1) must be phi'(x) = 1 / (1 + e^-x)")
    rng = np.random.default_rng(3)
    q, k, v, dout = rng.standard_normal((4, 5, 3))
    grads = linattn.linear_attention_backward(dout, q, k, v, causal=True,
                                              feature_map=feature_map)
    h = 1e-6
    for which, g in enumerate(grads):
        for idx in np.ndindex(g.shape):
            plus, minus = [q.copy(), k.copy(), v.copy()], [q.copy(), k.copy(), v.copy()]
            plus[which][idx] += h
            minus[which][idx] -= h
            diff = np.sum((linattn.linear_attention(*plus, causal=True, feature_map=feature_map)
                           - linattn.linear_attention(*minus, causal=True,
                                                      feature_map=feature_map)) * dout) / (2 * h)
            np.testing.assert_allclose(g[idx], diff, rtol=1e-5, atol=1e-8,
                                       err_msg="the backward pass through your map disagrees "
                                               "with central differences")


def check_exercise_3(feature_map):
    report(3, _softplus, feature_map)
