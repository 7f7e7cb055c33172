"""Exercise solutions and checks for notebook 07, training a linear transformer.

Katharopoulos et al. (2020), arXiv:2006.16236: the copy task of section 4.1, trained with
Adam, and generation as an RNN, Eq. (16)-(20).

1. ``cross_entropy_grad``: the gradient of the weighted mean cross-entropy w.r.t. the logits.
2. ``adam_step``: one bias-corrected Adam update of one array.
3. ``crossover_tokens``: the first position at which softmax's key/value cache holds more
   numbers than the linear model's RNN state.

Each ``check_exercise_N(fn)`` prints the verdict and returns True when fn is right (False
while it raises NotImplementedError); a wrong answer fails an assertion.
"""
import numpy as np

from linattn.model.layers import cross_entropy, cross_entropy_backward
from linattn.model.optim import AdamConfig, adam_init, adam_update

from checks._exercises import attempter

_attempt = attempter(__file__)


def cross_entropy_grad(logits, targets, weights):
    """Exercise 1: d loss / d logits for loss = sum_t w_t (-log softmax(logits_t)[y_t]) /
    sum_t w_t; logits (..., V), targets and weights (...)."""
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)                                 # softmax
    onehot = np.eye(logits.shape[-1])[targets]
    return weights[..., None] * (p - onehot) / weights.sum()


def adam_step(p, g, m, v, t, lr=1e-3, beta1=0.9, beta2=0.98, eps=1e-8):
    """Exercise 2: update number t (from 1) of parameter p with gradient g and moments m, v.
    Returns (p, m, v)."""
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)             # bias corrections
    return p - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


def crossover_tokens(n_heads, d_head):
    """Exercise 3: the first t at which the key/value cache, 2 H d t numbers, exceeds the
    state, H (d^2 + d) numbers: t > (d + 1) / 2."""
    return (d_head + 1) // 2 + 1



def check_exercise_1(fn):
    """True when fn(logits, targets, weights) is cross_entropy's gradient."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 5, 7))
    targets = rng.integers(0, 7, (3, 5))
    weights = (rng.random((3, 5)) < 0.6).astype(float)
    weights[0, 0] = 1.0
    got = _attempt(1, fn, logits, targets, weights)
    if got is None:
        return False
    np.testing.assert_allclose(got, cross_entropy_backward(1.0, logits, targets, weights)[0],
                               rtol=1e-10, atol=1e-14)
    u, h = rng.standard_normal(logits.shape), 1e-6
    slope = (cross_entropy(logits + h * u, targets, weights)
             - cross_entropy(logits - h * u, targets, weights)) / (2 * h)
    np.testing.assert_allclose(np.sum(got * u), slope, rtol=1e-6)
    print("exercise 1: right, equals cross_entropy_backward and a central difference")
    return True


def check_exercise_2(fn):
    """True when three steps of fn equal three steps of the library's adam_update (with no
    warm-up and no clipping)."""
    rng = np.random.default_rng(1)
    cfg = AdamConfig(lr=1e-2, warmup=1, clip=0.0)
    params = {"w": rng.standard_normal((4, 3))}
    state = adam_init(params)
    p, m, v = params["w"], np.zeros((4, 3)), np.zeros((4, 3))
    for t in range(1, 4):
        g = rng.standard_normal((4, 3))
        params, state, _ = adam_update(params, {"w": g}, state, cfg)
        got = _attempt(2, fn, p, g, m, v, t, cfg.lr, cfg.beta1, cfg.beta2, cfg.eps)
        if got is None:
            return False
        p, m, v = got
        np.testing.assert_allclose(p, params["w"], rtol=1e-12)
    print("exercise 2: right, three steps equal adam_update's")
    return True


def check_exercise_3(fn):
    """True when fn(H, d) is the first position where the cache outgrows the state."""
    got = _attempt(3, fn, 4, 16)
    if got is None:
        return False
    for heads, d in ((4, 16), (8, 64), (1, 1), (2, 7)):
        state = heads * (d * d + d)
        t = next(t for t in range(1, 10 * d + 10) if 2 * heads * d * t > state)
        assert fn(heads, d) == t, f"H = {heads}, d = {d}: the cache passes the state at {t}"
    print("exercise 3: right")
    return True
