"""Exercises of notebook 02 (kernels and associativity): our solutions and the checks.

Each ``check_exercise_N(answer)`` prints "Exercise N: correct" for a right answer, raises
AssertionError saying what is wrong otherwise, and prints a note while the answer still
raises NotImplementedError (the notebook's starting point).
"""
import numpy as np

import linattn
from linattn.lab.bench.timing import peak_bytes

from checks._exercises import report as _report



# ---- Exercise 1: non-causal linear attention in O(N) -----------------------------------------

def linear_attention_einsum(q, k, v, eps=1e-6):
    """phi(q_i)^T S / (phi(q_i)^T z + eps), S = sum_j phi(k_j) v_j^T, z = sum_j phi(k_j):
    Eq. (5)-(6) with phi = elu + 1 (Eq. 7). Memory O(N (F + M) + F M), no N x N array."""
    phi = linattn.EluPlusOne()
    phi_q, phi_k = phi.forward(q), phi.forward(k)                # (..., Nq, F), (..., Nk, F)
    S = np.einsum("...nf,...nm->...fm", phi_k, v)                 # (..., F, M), Eq. (5)
    z = np.einsum("...nf->...f", phi_k)                           # (..., F)
    num = np.einsum("...nf,...fm->...nm", phi_q, S)               # (..., Nq, M)
    den = np.einsum("...nf,...f->...n", phi_q, z)[..., None] + eps  # (..., Nq, 1)
    return num / den


def _check_1(attention):
    rng = np.random.default_rng(3)
    for lead in ((), (2,), (2, 3)):
        for n_q, n_k in ((1, 1), (5, 5), (3, 7)):               # Nq != Nk: cross-attention
            q = rng.standard_normal((*lead, n_q, 4))
            k = rng.standard_normal((*lead, n_k, 4))
            v = rng.standard_normal((*lead, n_k, 3))
            for eps in (1e-6, 0.5):
                want = linattn.linear_attention(q, k, v, eps=eps, method="quadratic",
                                                backend="numpy")
                got = attention(q, k, v, eps=eps)
                assert got.shape == want.shape, f"shape {got.shape}, want {want.shape}"
                np.testing.assert_allclose(
                    got, want, rtol=1e-10, atol=1e-12,
                    err_msg=f"leading axes {lead}, Nq = {n_q}, Nk = {n_k}, eps = {eps}")
    n = 4096
    q, k, v = rng.standard_normal((3, n, 8))
    attention(q, k, v)                                  # the first call may set things up
    peak = peak_bytes(lambda: attention(q, k, v))
    n_by_n = n * n * 8
    print(f"peak memory at N = {n}: {peak / 2**20:.2f} MiB (one N x N float64 array: "
          f"{n_by_n / 2**20:.0f} MiB)")
    assert peak < n_by_n / 4, "the peak memory grows like N^2: an N x N array was built"


def check_exercise_1(linear_attention_einsum):
    """linear_attention_einsum(q, k, v, eps=1e-6) -> out (..., Nq, M)."""
    return _report(1, _check_1, linear_attention_einsum)


# ---- Exercise 2: the flop count of Eq. (6) ----------------------------------------------------

def matmul_multiply_adds(a_shape, b_shape):
    """(p, r) @ (r, s): p s outputs, each r multiply-adds."""
    (p, r), (r_b, s) = a_shape, b_shape
    assert r == r_b, "inner sizes differ"
    return p * r * s


def _sides(n, f, m, cost):
    """Multiply-adds of (phi(Q) phi(K)^T) V and of phi(Q) (phi(K)^T V) for N, F, M."""
    left = cost((n, f), (f, n)) + cost((n, n), (n, m))            # N^2 F + N^2 M
    right = cost((f, n), (n, m)) + cost((n, f), (f, m))           # 2 N F M
    return left, right


def cheaper_from(F, M):
    """The smallest N with 2 N F M < N^2 (F + M): N > 2 F M / (F + M)."""
    return 2 * F * M // (F + M) + 1


def _check_2(cost, cheaper):
    for a, b, want in (((2, 3), (3, 4), 24), ((1, 5), (5, 1), 5), ((7, 1), (1, 2), 14)):
        got = cost(a, b)
        assert got == want, f"matmul_multiply_adds({a}, {b}) = {got}, want {want}"
    for f, m in ((64, 64), (1, 1), (4, 16), (3, 5), (128, 32)):
        brute = next(n for n in range(1, 10**4) if _sides(n, f, m, cost)[1]
                     < _sides(n, f, m, cost)[0])
        got = cheaper(f, m)
        assert got == brute, (f"cheaper_from({f}, {m}) = {got}, but the right side is first "
                              f"cheaper at N = {brute}")


def check_exercise_2(matmul_multiply_adds, cheaper_from):
    """matmul_multiply_adds((p, r), (r, s)) -> int; cheaper_from(F, M) -> int."""
    return _report(2, _check_2, matmul_multiply_adds, cheaper_from)


# ---- Exercise 3: the softmax weight LSH keeps ---------------------------------------------------

def softmax_weight_kept(qk, n_hashes, chunk_size):
    """Mean over queries of the softmax weight (shared QK, every pair but i = j) that the
    mask of ``lsh_attention_mask`` keeps. qk (N, D)."""
    n, d = qk.shape
    unit = qk / np.linalg.norm(qk, axis=1, keepdims=True)        # the keys
    logits = np.where(np.eye(n, dtype=bool), -np.inf, qk @ unit.T / np.sqrt(d))
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    mask = linattn.lsh_attention_mask(qk, n_hashes=n_hashes, chunk_size=chunk_size)
    return float(np.mean(np.sum(weights * mask, axis=1)))


def _check_3(kept):
    rng = np.random.default_rng(0)
    topics = 4 * rng.standard_normal((4, 8))
    qk = topics[np.repeat(np.arange(4), 16)] + 0.5 * rng.standard_normal((64, 8))
    for n_hashes in (1, 2, 4, 8):
        want = softmax_weight_kept(qk, n_hashes, 8)
        got = kept(qk, n_hashes, 8)
        print(f"n_hashes = {n_hashes}: {got:.3f} of the softmax weight kept")
        assert abs(got - want) < 1e-9, f"n_hashes = {n_hashes}: {got}, want {want:.6f}"
    everything = kept(qk, 1, 64)                       # one chunk of N: every pair is seen
    assert abs(everything - 1) < 1e-9, f"chunk_size = N keeps every pair, got {everything}"


def check_exercise_3(softmax_weight_kept):
    """softmax_weight_kept(qk, n_hashes, chunk_size) -> float in [0, 1]."""
    return _report(3, _check_3, softmax_weight_kept)
