"""Our answers to notebook 06's exercises, feature maps (the checks are in
``checks/06_feature_maps.py``).

1. ``elu_plus_one`` and ``elu_plus_one_vjp``: Eq. (7) of Katharopoulos et al. (2020),
   arXiv:2006.16236, and its backward pass.
2. ``taylor3_features``: [1, x, vec(x x^T) / sqrt(2), vec(x x x) / sqrt(6)], the kernel
   1 + s + s^2/2 + s^3/6 of the first four terms of exp(s).
3. ``Softplus``: phi(x) = log(1 + e^x), positive with a slope that is never 0.
"""
import math

import numpy as np


def elu_plus_one(x):
    """Exercise 1a: elu(x) + 1 = x + 1 for x > 0, exp(x) otherwise."""
    return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))


def elu_plus_one_vjp(x, dphi):
    """Exercise 1b: dx = dphi * phi'(x), phi'(x) = 1 for x > 0, exp(x) otherwise."""
    return dphi * np.where(x > 0, 1.0, np.exp(np.minimum(x, 0)))


def taylor3_features(x):
    """Exercise 2: (..., D) -> (..., 1 + D + D^2 + D^3). The degree-n block is the
    n-fold outer product over sqrt(n!): its dot product is (q.k)^n / n!."""
    lead, d = x.shape[:-1], x.shape[-1]
    outer2 = x[..., :, None] * x[..., None, :]                          # (..., D, D)
    outer3 = outer2[..., None] * x[..., None, None, :]                  # (..., D, D, D)
    return np.concatenate([np.ones((*lead, 1), dtype=x.dtype), x,
                           outer2.reshape(*lead, d * d) / math.sqrt(2),
                           outer3.reshape(*lead, d ** 3) / math.sqrt(6)], axis=-1)


class Softplus:
    """Exercise 3: phi(x) = log(1 + e^x), and its backward pass phi'(x) = 1 / (1 + e^-x)."""

    def forward(self, x):
        return np.logaddexp(0, x)                     # log(e^0 + e^x), without overflow

    def vjp(self, x, dphi):
        return dphi / (1 + np.exp(-x))
