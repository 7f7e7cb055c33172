"""Checks of the exercises of notebook 03 (causal masking). Each ``check_exercise_N`` prints
"Exercise N: correct", raises AssertionError saying what is wrong, or says the exercise is not
attempted yet while the answer raises NotImplementedError."""
import numpy as np

import linattn

from ._exercises import assert_below_n_by_n, report


def _banded(q, k, v, window, eps):
    """The quadratic oracle: A masked to j <= i and i - j < window."""
    phi = linattn.EluPlusOne()
    a = phi.forward(q) @ phi.forward(k).T
    i, j = np.indices(a.shape)
    a = np.where((j <= i) & (i - j < window), a, 0)
    return (a @ v) / (a.sum(axis=1, keepdims=True) + eps)


# ---- Exercise 1: the chunked form without a loop over the blocks ----------------------------

def _check_1(chunked):
    rng = np.random.default_rng(5)
    for n, c in ((12, 4), (12, 1), (12, 12), (40, 8)):
        q, k = rng.standard_normal((2, n, 3))
        v = rng.standard_normal((n, 2))
        for eps in (1e-6, 0.5):
            want = linattn.linear_attention(q, k, v, causal=True, method="quadratic", eps=eps)
            got = chunked(q, k, v, c, eps=eps)
            assert got.shape == want.shape, f"shape {got.shape}, want {want.shape}"
            np.testing.assert_allclose(
                got, want, rtol=1e-10, atol=1e-12,
                err_msg=f"N = {n}, C = {c}, eps = {eps}: the state entering block b is the "
                        "sum over the blocks before b, not including b")
    n = 4096
    q, k, v = rng.standard_normal((3, n, 16))
    assert_below_n_by_n(lambda: chunked(q, k, v, 64), n, ", C = 64", 1 / 4,
                        "the peak memory grows like N^2: an N x N array was built")


def check_exercise_1(chunked_causal_vectorized):
    """chunked_causal_vectorized(q, k, v, chunk_size, eps=1e-6) -> out (N, M), N a multiple
    of chunk_size."""
    return report(1, _check_1, chunked_causal_vectorized)


# ---- Exercise 2: a sliding window from two running sums -------------------------------------

def _check_2(windowed):
    rng = np.random.default_rng(6)
    for n, window in ((9, 1), (9, 3), (9, 9), (9, 20), (30, 7)):
        q, k = rng.standard_normal((2, n, 3))
        v = rng.standard_normal((n, 2))
        got = windowed(q, k, v, window)
        want = _banded(q, k, v, window, 1e-6)
        assert got.shape == want.shape, f"shape {got.shape}, want {want.shape}"
        np.testing.assert_allclose(
            got, want, rtol=1e-9, atol=1e-12,
            err_msg=f"N = {n}, W = {window}: query i sees the W keys i - W + 1 .. i "
                    "(itself included), in the numerator and the normaliser")
    n = 4096
    q, k, v = rng.standard_normal((3, n, 16))
    assert_below_n_by_n(lambda: windowed(q, k, v, 64), n, ", W = 64", 1 / 4,
                        "the peak memory grows like N^2: an N x N array was built")


def check_exercise_2(windowed_linear_attention):
    """windowed_linear_attention(q, k, v, window, eps=1e-6) -> out (N, M)."""
    return report(2, _check_2, windowed_linear_attention)
