"""Adam with global-norm gradient clipping and a linear learning-rate warm-up.

Adam (Kingma and Ba, 2015) is the optimiser the experiments of Katharopoulos et al. (2020),
arXiv:2006.16236, section 4, train with. Everything here is a pure function of its inputs:
the same parameters, gradients and state give the same update, so training is
deterministic given a seed and resumes exactly from a saved ``AdamState``.

``adam_update`` here, in NumPy, is the reference; the compiled path runs the same update
as one compiled pass a parameter (``model.fast.optim.adam_update``), and ``model.paths``
chooses between the two with the rest of the model's path.
"""
from typing import NamedTuple

import numpy as np


class AdamConfig(NamedTuple):
    """lr: peak learning rate; beta1, beta2, eps: Adam's constants; warmup: steps of linear
    ramp from lr/warmup to lr; clip: maximum global gradient norm (0 disables clipping)."""

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-8
    warmup: int = 100
    clip: float = 1.0


class AdamState(NamedTuple):
    """step: updates taken so far; m, v: first and second moment estimates, dicts shaped
    like the parameters."""

    step: int
    m: dict
    v: dict


def adam_init(params):
    """The state before the first update: step 0, zero moments."""
    return AdamState(0, {n: np.zeros_like(a) for n, a in params.items()},
                     {n: np.zeros_like(a) for n, a in params.items()})


def learning_rate(cfg, step):
    """lr * min(1, (step + 1) / warmup): the rate of update number ``step`` (from 0)."""
    return cfg.lr * min(1.0, (step + 1) / max(cfg.warmup, 1))


def global_norm(grads, squares=None):
    """sqrt(sum of squares of every gradient entry), accumulated in float64; each array's
    sum by ``squares`` (NumPy's by default; the compiled path passes its own)."""
    squares = squares or (lambda g: np.sum(np.square(g, dtype=np.float64)))
    return float(np.sqrt(sum(squares(g) for g in grads.values())))


def clip_gradients(grads, max_norm):
    """Scale all gradients by min(1, max_norm / norm) (no change if max_norm is 0).

    Returns
    -------
    grads : dict
    norm : float
        The global norm before clipping.
    """
    norm = global_norm(grads)
    if max_norm <= 0 or norm <= max_norm:
        return grads, norm
    scale = max_norm_scale(norm, max_norm)
    return {n: g * g.dtype.type(scale) for n, g in grads.items()}, norm


def max_norm_scale(norm, max_norm):
    """The factor ``clip_gradients`` scales by: min(1, max_norm / norm), 1 if max_norm is 0."""
    return 1.0 if max_norm <= 0 or norm <= max_norm else max_norm / norm


def check_gradients(params, grads):
    """A ValueError naming the entries unless ``grads`` has exactly the keys of ``params``."""
    if grads.keys() != params.keys():
        raise ValueError(f"gradients for {sorted(set(grads) ^ set(params))} do not match "
                         "the parameters")


def adam_update(params, grads, state, cfg):
    """One Adam step with clipping and warm-up, in NumPy: the reference.

    m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
    p = p - lr_t * mhat / (sqrt(vhat) + eps) with bias-corrected mhat, vhat.

    Parameters
    ----------
    params, grads : dict of str -> ndarray, same keys and shapes
    state : AdamState
    cfg : AdamConfig

    Returns
    -------
    params : dict, the updated parameters (new arrays)
    state : AdamState
    norm : float, the gradient norm before clipping
    """
    check_gradients(params, grads)
    grads, norm = clip_gradients(grads, cfg.clip)
    lr = learning_rate(cfg, state.step)
    t = state.step + 1
    c1, c2 = 1 - cfg.beta1**t, 1 - cfg.beta2**t              # bias corrections
    new_params, m, v = {}, {}, {}
    for name, p in params.items():
        g = grads[name]
        m[name] = cfg.beta1 * state.m[name] + (1 - cfg.beta1) * g
        v[name] = cfg.beta2 * state.v[name] + (1 - cfg.beta2) * g * g
        step = lr * (m[name] / c1) / (np.sqrt(v[name] / c2) + cfg.eps)
        new_params[name] = (p - step).astype(p.dtype, copy=False)
    return new_params, AdamState(t, m, v), norm
