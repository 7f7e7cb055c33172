"""Exercises of notebook 04 (transformers are RNNs): our solutions and the checks.

Each ``check_exercise_N(answer)`` prints "Exercise N: correct" for a right answer, raises
AssertionError saying what is wrong otherwise, and prints a note while the answer still
raises NotImplementedError (the notebook's starting point).
"""
import numpy as np

import linattn

from checks._exercises import report as _report



# ---- Exercise 1: the RNN step, Eq. (18)-(20) ---------------------------------------------------

def rnn_step(q_i, k_i, v_i, S, z, eps=1e-6):
    """One token: s_i = s_{i-1} + phi(k_i) v_i^T (18), z_i = z_{i-1} + phi(k_i) (19),
    out_i = phi(q_i)^T s_i / (phi(q_i)^T z_i + eps), the attention part of (20).
    q_i, k_i (..., D); v_i (..., M); S (..., F, M); z (..., F)."""
    phi = linattn.EluPlusOne()
    phi_q, phi_k = phi.forward(q_i), phi.forward(k_i)           # (..., F)
    S = S + phi_k[..., :, None] * v_i[..., None, :]              # Eq. (18), (..., F, M)
    z = z + phi_k                                                # Eq. (19), (..., F)
    num = np.einsum("...f,...fm->...m", phi_q, S)                # (..., M)
    den = np.einsum("...f,...f->...", phi_q, z)[..., None] + eps  # (..., 1)
    return num / den, S, z


def _check_1(step):
    rng = np.random.default_rng(6)
    for lead in ((), (3,)):
        n, d, m = 9, 4, 5
        q, k = rng.standard_normal((2, n, *lead, d))
        v = rng.standard_normal((n, *lead, m))
        S, z = np.zeros((*lead, d, m)), np.zeros((*lead, d))
        state, outs = None, []
        for i in range(n):
            out_i, S, z = step(q[i], k[i], v[i], S, z, eps=1e-6)
            want_i, state = linattn.linear_attention_step(q[i], k[i], v[i], state, eps=1e-6,
                                                          backend="numpy")
            assert np.shape(out_i) == want_i.shape, (f"out shape {np.shape(out_i)}, "
                                                     f"want {want_i.shape}")
            np.testing.assert_allclose(S, state.S, rtol=1e-12, err_msg=f"S after step {i}")
            np.testing.assert_allclose(z, state.z, rtol=1e-12, err_msg=f"z after step {i}")
            np.testing.assert_allclose(out_i, want_i, rtol=1e-10, err_msg=f"out at step {i}")
            outs.append(out_i)
        want = linattn.linear_attention(np.moveaxis(q, 0, -2), np.moveaxis(k, 0, -2),
                                        np.moveaxis(v, 0, -2), causal=True, eps=1e-6,
                                        method="quadratic", backend="numpy")
        np.testing.assert_allclose(np.moveaxis(np.array(outs), 0, -2), want, rtol=1e-10,
                                   err_msg="the scan is not causal linear attention")


def check_exercise_1(rnn_step):
    """rnn_step(q_i, k_i, v_i, S, z, eps=1e-6) -> (out_i, S, z)."""
    return _report(1, _check_1, rnn_step)


# ---- Exercise 2: bytes of the state and of the cache ---------------------------------------------

def state_bytes(F, M, itemsize):
    """S is F x M and z is F numbers, whatever the position."""
    return (F * M + F) * itemsize


def cache_bytes(t, D, M, itemsize):
    """t keys of D numbers and t values of M numbers."""
    return t * (D + M) * itemsize


def cache_larger_from(F, D, M):
    """The first t with t (D + M) > F M + F."""
    return (F * M + F) // (D + M) + 1


def _check_2(state_size, cache_size, larger_from):
    rng = np.random.default_rng(7)
    for d, m, dtype in ((64, 64, np.float64), (3, 5, np.float32), (16, 8, np.float64)):
        itemsize = np.dtype(dtype).itemsize
        q, k = rng.standard_normal((2, d)).astype(dtype)
        v = rng.standard_normal(m).astype(dtype)
        _, state = linattn.linear_attention_step(q, k, v)        # elu + 1: F = D
        f = state.S.shape[0]
        got = state_size(f, m, itemsize)
        assert got == state.S.nbytes + state.z.nbytes, (
            f"state_bytes({f}, {m}, {itemsize}) = {got}, the arrays hold "
            f"{state.S.nbytes + state.z.nbytes}")
        for t in (1, 7, 1000):
            keys, values = np.empty((t, d), dtype), np.empty((t, m), dtype)
            got = cache_size(t, d, m, itemsize)
            assert got == keys.nbytes + values.nbytes, (
                f"cache_bytes({t}, {d}, {m}, {itemsize}) = {got}, the arrays hold "
                f"{keys.nbytes + values.nbytes}")
        brute = next(t for t in range(1, 10**6)
                     if cache_bytes(t, d, m, 1) > state_bytes(f, m, 1))
        got = larger_from(f, d, m)
        assert got == brute, f"cache_larger_from({f}, {d}, {m}) = {got}, want {brute}"


def check_exercise_2(state_bytes, cache_bytes, cache_larger_from):
    """state_bytes(F, M, itemsize), cache_bytes(t, D, M, itemsize), cache_larger_from(F, D, M)."""
    return _report(2, _check_2, state_bytes, cache_bytes, cache_larger_from)
