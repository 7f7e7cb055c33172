"""Our answers to notebook 09's exercises, rounding in the running state (the checks are in
``checks/09_rounding_in_the_state.py``).

1. ``two_sum``: Knuth's TwoSum, s = fl(a + b) and the exact error e = (a + b) - s.
2. ``kahan_cumsum``: running sums with Kahan's compensation, in the input's dtype.
"""
import numpy as np


def two_sum(a, b):
    """Exercise 1: (s, e) with s = a + b rounded and s + e = a + b exactly, in a's dtype."""
    s = a + b
    b_in_s = s - a                                     # the part of b that made it into s
    a_in_s = s - b_in_s                                # and the part of a
    return s, (a - a_in_s) + (b - b_in_s)              # what each lost


def kahan_cumsum(x):
    """Exercise 2: the running sums of x (N,) in x's dtype, Kahan-compensated."""
    out = np.empty_like(x)
    total, lost = x.dtype.type(0), x.dtype.type(0)
    for i, term in enumerate(x):
        y = term - lost                                # the term, less what was lost before
        t = total + y
        lost = (t - total) - y                         # what this addition lost, negated
        total = out[i] = t
    return out
