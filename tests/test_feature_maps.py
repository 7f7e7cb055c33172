"""Feature maps: positivity, the kernels they stand for, and their vector-Jacobian products."""
import numpy as np
import pytest

from linattn import EluPlusOne, Favor, ReLU, Taylor, linear_attention
from linattn.feature_maps import get_feature_map

from helpers import FEATURE_MAP_NAMES, assert_gradients_match

MAPS = [EluPlusOne(), ReLU(), Taylor(), Favor(n_features=7, seed=3)]


@pytest.mark.parametrize("fmap", MAPS, ids=repr)
def test_vjp_matches_finite_differences(fmap):
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    x[np.abs(x) < 1e-3] = 0.5  # keep ReLU's kink away from the finite-difference step
    assert_gradients_match(fmap.forward, lambda dphi, x: (fmap.vjp(x, dphi),), (x,))


def test_elu_plus_one_is_eq7():
    x = np.array([-3.0, -0.5, 0.0, 0.5, 2.0])
    want = np.where(x > 0, x, np.exp(x) - 1) + 1
    np.testing.assert_allclose(EluPlusOne().forward(x), want, rtol=1e-15)
    assert np.all(EluPlusOne().forward(-50 * np.abs(x) - 1) > 0)


def test_taylor_kernel_is_second_order_exp():
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 5))
    phi = Taylor()
    s = q @ k
    np.testing.assert_allclose(phi.forward(q) @ phi.forward(k), 1 + s + s * s / 2, rtol=1e-13)
    assert phi.forward(q).shape == (1 + 5 + 25,)


def test_favor_approximates_softmax_kernel_better_with_more_features():
    rng = np.random.default_rng(2)
    d = 8
    q, k = rng.standard_normal((2, 32, d)) * 0.5
    want = np.exp(q @ k.T / np.sqrt(d))
    errors = []
    for f in (16, 256, 4096):
        phi = Favor(n_features=f, seed=0)
        assert np.all(phi.forward(q) > 0)
        got = phi.forward(q) @ phi.forward(k).T
        errors.append(np.mean(np.abs(got - want) / want))
    assert errors[0] > errors[1] > errors[2] and errors[2] < 0.05, errors


def test_favor_directions_are_orthogonal_within_a_block_and_seeded():
    w = Favor(n_features=8, seed=5).directions(8)
    gram = w.T @ w
    np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0, atol=1e-10)
    np.testing.assert_array_equal(w, Favor(n_features=8, seed=5).directions(8))
    assert not np.allclose(w, Favor(n_features=8, seed=6).directions(8))


@pytest.mark.parametrize("fmap", MAPS, ids=repr)
def test_nan_stays_nan(fmap):
    x = np.array([[0.3, np.nan, -0.2]])
    assert np.any(np.isnan(fmap.forward(x)))
    assert np.any(np.isnan(fmap.vjp(x, np.ones_like(fmap.forward(x)))))


def test_names_and_custom_objects():
    for name in FEATURE_MAP_NAMES:
        assert callable(get_feature_map(name).forward)

    class Square:  # a user's own map: phi(x) = x**2 elementwise
        def forward(self, x):
            return x * x

        def vjp(self, x, dphi):
            return 2 * x * dphi

    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((3, 6, 2))
    got = linear_attention(q, k, v, feature_map=Square(), method="linear")
    a = (q * q) @ (k * k).T
    np.testing.assert_allclose(got, (a @ v) / (a.sum(1, keepdims=True) + 1e-6), rtol=1e-12)


def test_bad_feature_maps_are_rejected():
    q = np.ones((3, 2))
    with pytest.raises(ValueError, match="elu\\+1, relu, taylor, favor"):
        linear_attention(q, q, q, feature_map="softmax")
    with pytest.raises(TypeError, match="forward"):
        linear_attention(q, q, q, feature_map=np.exp)
    with pytest.raises(ValueError, match="n_features"):
        Favor(n_features=0)
