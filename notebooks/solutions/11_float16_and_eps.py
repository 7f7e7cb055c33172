"""Our answers to notebook 11's exercises, float16 and eps (the checks are in
``checks/11_float16_and_eps.py``).

1. ``elu_plus_one_mean``: E[elu(k) + 1] for k ~ N(mu, 1).
2. ``float16_overflow_n``: the first N with N * mean > 65504.
3. ``exp_underflow_below``: float32's exp rounds to 0 below ln(2^-150).
"""
import math

import numpy as np


def _normal_cdf(x):
    return math.erfc(-x / math.sqrt(2)) / 2


def elu_plus_one_mean(mu):
    """Exercise 1: E[(k + 1) 1_{k > 0}] + E[e^k 1_{k <= 0}], k ~ N(mu, 1):
    (mu + 1) Phi(mu) + pdf(mu) + e^{mu + 1/2} Phi(-mu - 1)."""
    pdf = math.exp(-mu * mu / 2) / math.sqrt(2 * math.pi)
    return (mu + 1) * _normal_cdf(mu) + pdf + math.exp(mu + 0.5) * _normal_cdf(-mu - 1)


def float16_overflow_n(mean_phi):
    """Exercise 2: the first N at which z = N * mean_phi passes float16's largest value."""
    return int(np.floor(float(np.finfo(np.float16).max) / mean_phi)) + 1


def exp_underflow_below():
    """Exercise 3: the smallest float32 above 0 is 2^-149; a result below half of it,
    2^-150, rounds to 0, so exp(x) = 0 for x < ln(2^-150) = -150 ln 2."""
    return -150 * math.log(2)
