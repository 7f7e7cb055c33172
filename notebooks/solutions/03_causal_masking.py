"""Exercises of notebook 03 (causal masking): our solutions and the checks.

Each ``check_exercise_N(answer)`` prints "Exercise N: correct" for a right answer, raises
AssertionError saying what is wrong otherwise, and prints a note while the answer still
raises NotImplementedError (the notebook's starting point).
"""
import numpy as np

import linattn
from linattn.lab.bench.timing import peak_bytes

from checks._exercises import report as _report



def _oracle(q, k, v, eps):
    return linattn.linear_attention(q, k, v, causal=True, eps=eps, method="quadratic",
                                    backend="numpy")


# ---- Exercise 1: the causal running sums, Eq. (10)-(12) --------------------------------------

def causal_linear_attention(q, k, v, eps=1e-6):
    """Causal linear attention by running sums: q, k (N, D), v (N, M) -> (N, M)."""
    phi = linattn.EluPlusOne()
    phi_q, phi_k = phi.forward(q), phi.forward(k)               # (N, F)
    S = np.zeros((phi_k.shape[1], v.shape[1]))                   # (F, M)
    z = np.zeros(phi_k.shape[1])                                 # (F,)
    out = np.empty(v.shape)
    for i in range(len(v)):
        S += np.outer(phi_k[i], v[i])                            # Eq. (10)
        z += phi_k[i]                                            # Eq. (11)
        out[i] = phi_q[i] @ S / (phi_q[i] @ z + eps)             # Eq. (12)
    return out


def _check_1(attention):
    rng = np.random.default_rng(4)
    for n in (1, 2, 7, 33):
        q, k = rng.standard_normal((2, n, 3))
        v = rng.standard_normal((n, 4))
        for eps in (1e-6, 0.5):
            got = attention(q, k, v, eps=eps)
            assert got.shape == (n, 4), f"shape {got.shape}, want {(n, 4)}"
            np.testing.assert_allclose(got, _oracle(q, k, v, eps), rtol=1e-10, atol=1e-12,
                                       err_msg=f"N = {n}, eps = {eps}")
    n = 2048
    q, k, v = rng.standard_normal((3, n, 4))
    peak = peak_bytes(lambda: attention(q, k, v))
    assert peak < n * n * 8 / 4, ("the peak memory grows like N^2: an N x N array was built; "
                                  "use running sums")


def check_exercise_1(causal_linear_attention):
    """causal_linear_attention(q, k, v, eps=1e-6) -> out (N, M)."""
    return _report(1, _check_1, causal_linear_attention)


# ---- Exercise 2: the chunked forward ------------------------------------------------------------

def chunked_causal_linear_attention(q, k, v, chunk_size, eps=1e-6):
    """Causal linear attention in blocks of chunk_size positions: inside a block the masked
    product tril(Q_b K_b^T) V_b, between blocks the state S_b (V carries a column of ones
    for the denominator)."""
    phi = linattn.EluPlusOne()
    phi_q, phi_k = phi.forward(q), phi.forward(k)               # (N, F)
    n, m = v.shape
    v1 = np.concatenate([v, np.ones((n, 1))], axis=1)           # (N, M + 1)
    S = np.zeros((phi_k.shape[1], m + 1))                        # the state entering a block
    num_den = np.empty((n, m + 1))
    for start in range(0, n, chunk_size):
        b = slice(start, start + chunk_size)                     # the last block may be short
        num_den[b] = np.tril(phi_q[b] @ phi_k[b].T) @ v1[b] + phi_q[b] @ S
        S += phi_k[b].T @ v1[b]
    return num_den[:, :m] / (num_den[:, m:] + eps)


def _check_2(attention):
    rng = np.random.default_rng(5)
    for n in (1, 5, 16, 37):
        q, k = rng.standard_normal((2, n, 3))
        v = rng.standard_normal((n, 2))
        for c in (1, 4, 8, 64):
            got = attention(q, k, v, c, eps=1e-6)
            assert got.shape == (n, 2), f"shape {got.shape}, want {(n, 2)}"
            np.testing.assert_allclose(got, _oracle(q, k, v, 1e-6), rtol=1e-10, atol=1e-12,
                                       err_msg=f"N = {n}, chunk_size = {c}")


def check_exercise_2(chunked_causal_linear_attention):
    """chunked_causal_linear_attention(q, k, v, chunk_size, eps=1e-6) -> out (N, M)."""
    return _report(2, _check_2, chunked_causal_linear_attention)
