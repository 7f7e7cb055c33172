"""Checks of notebook 07's exercises, training a linear transformer (Katharopoulos et al.,
2020, arXiv:2006.16236: the copy task of section 4.1, trained with Adam, and generation as
an RNN, Eq. (16)-(20)).

1. ``fn(logits, targets, weights)``: the gradient of the weighted mean cross-entropy.
2. ``fn(p, g, m, v, t, lr, beta1, beta2, eps)``: one bias-corrected Adam update.
3. ``fn(params, cfg, prompt, n_new)``: greedy generation, one ``model.generate.step`` per
   token, against the library's ``generate``.

``check_exercise_N(answer)`` prints "Exercise N: correct", raises AssertionError saying what
is wrong, or says the answer is not attempted yet while it raises NotImplementedError.
"""
import numpy as np

from linattn.model import generate, init_params
from linattn.model.layers import cross_entropy, cross_entropy_backward
from linattn.model.optim import AdamConfig, adam_init, adam_update
from linattn.model.train import copy_setup

from ._exercises import report


def _cross_entropy_grad(fn):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 5, 7))
    targets = rng.integers(0, 7, (3, 5))
    weights = (rng.random((3, 5)) < 0.6).astype(float)
    weights[0, 0] = 1.0
    got = fn(logits, targets, weights)
    assert np.shape(got) == logits.shape, f"one gradient per logit, {logits.shape}"
    np.testing.assert_allclose(got, cross_entropy_backward(1.0, logits, targets, weights)[0],
                               rtol=1e-10, atol=1e-14,
                               err_msg="w_t (softmax(l_t) - e_{y_t}) / sum_t w_t")
    u, h = rng.standard_normal(logits.shape), 1e-6
    slope = (cross_entropy(logits + h * u, targets, weights)
             - cross_entropy(logits - h * u, targets, weights)) / (2 * h)
    np.testing.assert_allclose(np.sum(got * u), slope, rtol=1e-6)


def check_exercise_1(fn):
    report(1, _cross_entropy_grad, fn)


def _adam_step(fn):
    rng = np.random.default_rng(1)
    cfg = AdamConfig(lr=1e-2, warmup=1, clip=0.0)         # no warm-up, no clipping
    params = {"w": rng.standard_normal((4, 3))}
    state = adam_init(params)
    p, m, v = params["w"], np.zeros((4, 3)), np.zeros((4, 3))
    for t in range(1, 4):
        g = rng.standard_normal((4, 3))
        params, state, _ = adam_update(params, {"w": g}, state, cfg)
        p, m, v = fn(p, g, m, v, t, cfg.lr, cfg.beta1, cfg.beta2, cfg.eps)
        np.testing.assert_allclose(p, params["w"], rtol=1e-12,
                                   err_msg=f"step {t} differs from adam_update's")


def check_exercise_2(fn):
    report(2, _adam_step, fn)


def _greedy(fn):
    task, cfg = copy_setup("linear", length=4, d_model=16, n_heads=2, d_mlp=32)
    cfg = cfg._replace(dtype="float64")
    params = init_params(cfg, seed=3)                      # untrained: any tokens will do
    prompt, _ = task.prompts(np.random.default_rng(4), 3)
    n_new = cfg.max_len + 1 - prompt.shape[1]
    got = np.asarray(fn(params, cfg, prompt, n_new))
    want = generate(params, cfg, prompt, n_new, method="recurrent")
    assert got.shape == want.shape, f"the prompt and {n_new} new tokens, {want.shape}"
    np.testing.assert_array_equal(got[:, :prompt.shape[1]], prompt,
                                  err_msg="the tokens start with the prompt")
    np.testing.assert_array_equal(got, want, err_msg="not the tokens generate() picks")


def check_exercise_3(fn):
    report(3, _greedy, fn)
