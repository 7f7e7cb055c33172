"""Each layer's hand-written backward against central finite differences (float64)."""
import numpy as np
import pytest

from helpers import assert_gradients_match
from linattn.model import layers


def _rng(seed=0):
    return np.random.default_rng(seed)


@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
def test_linear_backward(lead):
    rng = _rng()
    x, w, b = rng.standard_normal((*lead, 4)), rng.standard_normal((4, 5)), rng.standard_normal(5)
    assert_gradients_match(layers.linear, layers.linear_backward, [x, w, b])


@pytest.mark.parametrize("lead", [(3,), (2, 3)])
def test_layer_norm_backward(lead):
    rng = _rng(1)
    x = rng.standard_normal((*lead, 6)) * 3 + 1
    g, b = rng.standard_normal(6), rng.standard_normal(6)
    assert_gradients_match(layers.layer_norm, layers.layer_norm_backward, [x, g, b])


def test_layer_norm_normalises():
    x = _rng(2).standard_normal((4, 16)) * 5 + 3
    y = layers.layer_norm(x, np.ones(16), np.zeros(16))
    np.testing.assert_allclose(y.mean(axis=-1), 0, atol=1e-12)
    np.testing.assert_allclose(y.var(axis=-1), 1, rtol=1e-4)


@pytest.mark.parametrize("name", sorted(layers.ACTIVATIONS))
def test_activation_backward(name):
    act, act_backward = layers.ACTIVATIONS[name]
    x = _rng(3).standard_normal((3, 7)) * 2
    assert_gradients_match(act, act_backward, [x])


def test_gelu_values():
    # GELU(x) ~ x Phi(x): 0 at 0, ~x for large x, ~0 for very negative x
    x = np.array([0.0, 10.0, -10.0, 1.0])
    np.testing.assert_allclose(layers.gelu(x)[:3], [0, 10, 0], atol=1e-6)
    assert abs(layers.gelu(x)[3] - 0.8413) < 1e-3  # 1 * Phi(1)


def test_embedding_backward_accumulates_repeated_ids():
    rng = _rng(4)
    ids = np.array([[0, 2, 2], [4, 0, 2]])                    # repeats must add up
    table = rng.standard_normal((5, 3))
    assert_gradients_match(lambda t: layers.embedding(ids, t),
                           lambda dout, t: layers.embedding_backward(dout, ids, t), [table])


@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_backward(weighted):
    rng = _rng(5)
    logits = rng.standard_normal((2, 3, 6)) * 3
    targets = rng.integers(0, 6, (2, 3))
    weights = (rng.random((2, 3)) > 0.4).astype(float) if weighted else None
    assert_gradients_match(
        lambda z: np.array(layers.cross_entropy(z, targets, weights)),
        lambda dloss, z: layers.cross_entropy_backward(dloss, z, targets, weights), [logits])


def test_cross_entropy_value():
    # uniform logits over V classes: loss = log V whatever the target; huge logits stay finite
    assert np.isclose(layers.cross_entropy(np.zeros((2, 5)), np.array([1, 3])), np.log(5))
    big = np.array([[1000.0, 0.0], [0.0, 1000.0]])
    assert np.isclose(layers.cross_entropy(big, np.array([0, 1])), 0.0)
    weights = np.array([1.0, 0.0])                            # second row does not count
    assert np.isclose(layers.cross_entropy(big, np.array([0, 0]), weights), 0.0)
