"""Checks of the exercises of notebook 12 (the state as fast weights). Each
``check_exercise_N`` prints "Exercise N: correct", raises AssertionError saying what is wrong,
or says the exercise is not attempted yet while the answer raises NotImplementedError."""
import numpy as np

import linattn
from linattn.lab.rounding import Identity

from ._exercises import report


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


# ---- Exercise 1: a chunk's state, in log space ----------------------------------------------

def _gated_state(S, phi_k, g, v):
    """The library's state after the chunk: gated linear attention on the given features,
    entered with S (z is carried too, and ignored)."""
    _, state = linattn.linear_attention(
        phi_k, phi_k, v, causal=True, feature_map=Identity(), log_gate=g, normalize=False,
        initial_state=linattn.State(S, np.zeros(S.shape[0])), return_state=True,
        method="quadratic", backend="numpy")
    return state.S


def _check_1(chunk_state):
    rng = np.random.default_rng(12)
    for c, f, m in ((4, 3, 2), (7, 2, 5), (1, 4, 3)):
        S = rng.standard_normal((f, m))
        phi_k = rng.uniform(0.0, 2.0, (c, f))                  # features, e.g. elu + 1
        g = -rng.uniform(0.0, 1.5, (c, f))
        v = rng.standard_normal((c, m))
        got = np.asarray(chunk_state(S.copy(), phi_k, g, v))
        want = _gated_state(S, phi_k, g, v)
        assert got.shape == want.shape, (
            f"C = {c}, F = {f}, M = {m}: S_next has shape {got.shape}, want {want.shape}")
        np.testing.assert_allclose(
            got, want, rtol=1e-10, atol=1e-12,
            err_msg=f"C = {c}, F = {f}, M = {m}: not the gated state; the entering state is "
                    "multiplied by the product of all C gates, and the write of position j by "
                    "the gates after j only")
    c, f, m = 8, 3, 2                                            # strong gates
    S = rng.standard_normal((f, m))
    phi_k, v = rng.uniform(0.0, 2.0, (c, f)), rng.standard_normal((c, m))
    g = np.full((c, f), -300.0)                                  # b reaches -2400
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        got = np.asarray(chunk_state(S, phi_k, g, v))
    assert np.all(np.isfinite(got)), (
        "gates of -300 per position: your state has inf or NaN. Some exponent you take is "
        "positive (exp(-b_j) overflows); take exp of b_last - b_j, which is <= 0, instead")
    np.testing.assert_allclose(got, _gated_state(S, phi_k, g, v), rtol=1e-10, atol=1e-300,
                               err_msg="gates of -300 per position: not the gated state")


def check_exercise_1(chunk_state):
    """chunk_state(S, phi_k, g, v) -> S_next (F, M)."""
    return report(1, _check_1, chunk_state)


# ---- Exercise 2: the same key twice ---------------------------------------------------------

def _check_2(predict_readouts):
    rng = np.random.default_rng(21)
    for m in (3, 1):
        keys, _ = np.linalg.qr(rng.standard_normal((4, 4)))     # orthonormal columns
        k1, k2 = keys[:, 0], keys[:, 1]
        a, b, c = rng.standard_normal((3, m))
        written_k, written_v = np.stack([k1, k1, k2]), np.stack([a, b, c])   # (3, D), (3, M)
        _, summed = linattn.linear_attention(written_k, written_k, written_v, causal=True,
                                             feature_map=Identity(), normalize=False,
                                             return_state=True, backend="numpy")
        _, delta = linattn.delta_rule_attention(written_k, written_k, written_v, np.ones(3),
                                                feature_map=None, return_state=True,
                                                backend="numpy")
        sum_read, delta_read = predict_readouts(a.copy(), b.copy(), c.copy())
        assert np.shape(sum_read) == (m,) and np.shape(delta_read) == (m,), (
            f"M = {m}: each readout has shape (M,) = ({m},); got {np.shape(sum_read)} and "
            f"{np.shape(delta_read)}")
        np.testing.assert_allclose(
            sum_read, summed.S.T @ k1, rtol=1e-10, atol=1e-12,
            err_msg="the sum rule: what does S^T k1 collect from each write, given k1.k1 = 1 "
                    "and k2.k1 = 0?")
        np.testing.assert_allclose(
            delta_read, delta.T @ k1, rtol=1e-10, atol=1e-12,
            err_msg="the delta rule, beta = 1: what does the memory answer for k1 right after "
                    "each write, and does the write under k2 change it?")


def check_exercise_2(predict_readouts):
    """predict_readouts(a, b, c) -> (sum_readout (M,), delta_readout (M,))."""
    return report(2, _check_2, predict_readouts)


# ---- Exercise 3: the WY matrix --------------------------------------------------------------

def _check_3(wy_T):
    rng = np.random.default_rng(33)
    for c, f, m in ((4, 3, 2), (6, 5, 3), (1, 2, 2)):
        K = _unit(rng.standard_normal((c, f)))
        beta = rng.uniform(0.2, 1.0, c)
        V = rng.standard_normal((c, m))
        S = rng.standard_normal((f, m))
        T = np.asarray(wy_T(K.copy(), beta.copy()))
        assert T.shape == (c, c), f"C = {c}: T has shape {T.shape}, want ({c}, {c})"
        assert np.allclose(np.triu(T, 1), 0), (
            f"C = {c}: T has entries above the diagonal; the inverse of a lower-triangular "
            "matrix times a diagonal one is lower triangular")
        np.testing.assert_allclose(np.diag(T), beta, rtol=1e-12,
                                   err_msg=f"C = {c}: T's diagonal should be beta")
        U, W = T @ V, T @ K
        S_next = S + K.T @ (U - W @ S)
        _, want = linattn.delta_rule_attention(K, K, V, beta, feature_map=None,
                                               method="recurrent", initial_state=S,
                                               return_state=True, backend="numpy")
        np.testing.assert_allclose(
            S_next, want, rtol=1e-10, atol=1e-12,
            err_msg=f"C = {c}, F = {f}: S + K^T (U - W S) with your T is not the state the "
                    "delta rule leaves; T = (I + tril(diag(beta) K K^T, -1))^-1 diag(beta)")


def check_exercise_3(wy_T):
    """wy_T(K, beta) -> T (C, C)."""
    return report(3, _check_3, wy_T)
