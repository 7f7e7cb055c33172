"""Checks of the exercises of notebook 02 (kernels and associativity). Each
``check_exercise_N`` prints "Exercise N: correct", raises AssertionError saying what is wrong,
or says the exercise is not attempted yet while the answer raises NotImplementedError."""
import numpy as np

import linattn

from ._exercises import assert_below_n_by_n, report


# ---- Exercise 1: hiding padded keys without the N x N matrix -------------------------------

def _masked_quadratic(q, k, v, key_mask, eps):
    phi = linattn.EluPlusOne()
    a = phi.forward(q) @ np.swapaxes(phi.forward(k), -1, -2) * key_mask[..., None, :]
    return (a @ v) / (a.sum(axis=-1, keepdims=True) + eps)


def _check_1(attention):
    rng = np.random.default_rng(1)
    for lead, n_q, n_k in (((), 5, 5), ((2,), 3, 7), ((2, 3), 6, 4)):
        q = rng.standard_normal((*lead, n_q, 3))
        k = rng.standard_normal((*lead, n_k, 3))
        v = rng.standard_normal((*lead, n_k, 2))
        key_mask = rng.random((*lead, n_k)) < 0.6
        key_mask[..., 0] = True                           # every row keeps a key
        for eps in (1e-6, 0.5):
            got = attention(q, k, v, key_mask, eps=eps)
            want = _masked_quadratic(q, k, v, key_mask, eps)
            assert got.shape == want.shape, f"shape {got.shape}, want {want.shape}"
            np.testing.assert_allclose(
                got, want, rtol=1e-10, atol=1e-12,
                err_msg=f"leading axes {lead}, Nq = {n_q}, Nk = {n_k}, eps = {eps}: a hidden "
                        "key must leave the numerator AND the normaliser")
    all_true = np.ones(k.shape[:-1], dtype=bool)
    np.testing.assert_allclose(attention(q, k, v, all_true), linattn.linear_attention(q, k, v),
                               rtol=1e-10, err_msg="with no key hidden: not linear_attention")
    n = 4096
    q, k, v = rng.standard_normal((3, n, 16))
    key_mask = np.arange(n) < n - 100                    # the last 100 keys are padding
    assert_below_n_by_n(lambda: attention(q, k, v, key_mask), n, "", 1 / 4,
                        "the peak memory grows like N^2: an N x N array was built")


def check_exercise_1(linear_attention_key_mask):
    """linear_attention_key_mask(q, k, v, key_mask, eps=1e-6) -> out (..., Nq, M)."""
    return report(1, _check_1, linear_attention_key_mask)


# ---- Exercise 2: when does associativity pay, for cross-attention --------------------------

def _costs(n_q, n_k, f, m):
    return n_q * n_k * f + n_q * n_k * m, n_k * f * m + n_q * f * m   # (quadratic, linear)


def _check_2(multiply_adds, cheaper):
    for a, b in (((3, 4), (4, 5)), ((1, 7), (7, 1)), ((6, 1), (1, 6))):
        want = a[0] * a[1] * b[1]
        got = multiply_adds(a, b)
        assert got == want, f"{a} @ {b}: you counted {got} multiply-adds, want {want}"
    for n_k, f, m in ((64, 64, 64), (1000, 64, 64), (10, 32, 32), (16, 32, 32), (33, 32, 32),
                      (5, 4, 8), (512, 16, 128)):
        quad_lin = [_costs(n_q, n_k, f, m) for n_q in range(1, 100_000)]
        want = next((n_q for n_q, (quad, lin) in enumerate(quad_lin, 1) if lin < quad), None)
        got = cheaper(n_k, f, m)
        assert got == want, (
            f"Nk = {n_k}, F = {f}, M = {m}: you said {got}, want {want}. Count both sides of "
            "Eq. (6) with Nq queries and Nk keys; the linear side pays Nk F M once, whatever "
            "Nq" + ("; and with few keys it may never win (return None)" if want is None else ""))


def check_exercise_2(matmul_multiply_adds, cheaper_from_queries):
    """matmul_multiply_adds((p, r), (r, s)) -> int; cheaper_from_queries(Nk, F, M) -> int or
    None."""
    return report(2, _check_2, matmul_multiply_adds, cheaper_from_queries)


# ---- Exercise 3: how many pairs one round of hashing keeps ----------------------------------

def _check_3(pairs_kept):
    rng = np.random.default_rng(4)
    for n, c in ((16, 4), (64, 8), (96, 32), (12, 2), (8, 1), (8, 8)):
        got = pairs_kept(n, c)
        for seed in range(3):                            # any data, any rotation
            qk = rng.standard_normal((n, 6))
            want = int(linattn.lsh_attention_mask(qk, n_hashes=1, chunk_size=c,
                                                  seed=seed).sum())
            assert got == want, (
                f"N = {n}, C = {c}: you said {got} pairs, lsh_attention_mask keeps {want}. "
                "A query sees its chunk and the one before, the first chunk only itself, and "
                "never its own position unless it sees nothing else")


def check_exercise_3(pairs_kept_one_round):
    """pairs_kept_one_round(N, C) -> int, N a multiple of C."""
    return report(3, _check_3, pairs_kept_one_round)
