"""Checks of the exercises of notebook 04 (transformers are RNNs). Each ``check_exercise_N``
prints "Exercise N: correct", raises AssertionError saying what is wrong, or says the exercise
is not attempted yet while the answer raises NotImplementedError."""
import numpy as np

import linattn

from ._exercises import report


# ---- Exercise 1: the state after a prompt, without stepping ---------------------------------

def _check_1(prefill):
    rng = np.random.default_rng(7)
    for lead in ((), (3,)):
        n_prompt, n_new = 6, 4
        q, k = rng.standard_normal((2, *lead, n_prompt + n_new, 5))
        v = rng.standard_normal((*lead, n_prompt + n_new, 2))
        S, z = prefill(k[..., :n_prompt, :], v[..., :n_prompt, :])
        stepped = None
        for i in range(n_prompt):
            _, stepped = linattn.linear_attention_step(q[..., i, :], k[..., i, :], v[..., i, :],
                                                       stepped)
        assert np.shape(S) == stepped.S.shape and np.shape(z) == stepped.z.shape, (
            f"leading axes {lead}: S {np.shape(S)} and z {np.shape(z)}, want "
            f"{stepped.S.shape} and {stepped.z.shape}")
        np.testing.assert_allclose(S, stepped.S, rtol=1e-12, atol=1e-12,
                                   err_msg=f"leading axes {lead}: S is not the stepped state")
        np.testing.assert_allclose(z, stepped.z, rtol=1e-12, atol=1e-12,
                                   err_msg=f"leading axes {lead}: z is not the stepped state")
        state = linattn.State(np.asarray(S), np.asarray(z))
        want = linattn.linear_attention(q, k, v, causal=True)
        for i in range(n_prompt, n_prompt + n_new):          # generation continues from it
            out, state = linattn.linear_attention_step(q[..., i, :], k[..., i, :], v[..., i, :],
                                                       state)
            np.testing.assert_allclose(out, want[..., i, :], rtol=1e-10)


def check_exercise_1(prefill_state):
    """prefill_state(k, v) -> (S, z): the state after the prompt, (..., F, M) and (..., F)."""
    return report(1, _check_1, prefill_state)


# ---- Exercise 2: a state that forgets ------------------------------------------------------

def _reference(q, k, v, gamma, eps):
    phi = linattn.EluPlusOne()
    phi_q, phi_k = phi.forward(q), phi.forward(k)
    S, z, out = 0.0, 0.0, []
    for i in range(len(q)):
        S = gamma * S + np.outer(phi_k[i], v[i])
        z = gamma * z + phi_k[i]
        out.append(phi_q[i] @ S / (phi_q[i] @ z + eps))
    return np.array(out)


def _check_2(step, parallel):
    rng = np.random.default_rng(8)
    n, d, m = 7, 3, 2
    q, k = rng.standard_normal((2, n, d))
    v = rng.standard_normal((n, m))
    for gamma in (1.0, 0.9, 0.5, 0.0):
        want = _reference(q, k, v, gamma, 1e-6)
        S, z, outs = np.zeros((d, m)), np.zeros(d), []
        for i in range(n):
            out, S, z = step(q[i], k[i], v[i], S, z, gamma)
            outs.append(out)
        np.testing.assert_allclose(
            np.array(outs), want, rtol=1e-10, atol=1e-12,
            err_msg=f"gamma = {gamma}: the step; s_i = gamma s_(i-1) + phi(k_i) v_i^T, z alike")
        np.testing.assert_allclose(
            parallel(q, k, v, gamma), want, rtol=1e-10, atol=1e-12,
            err_msg=f"gamma = {gamma}: the parallel form; unroll the step: which power of "
                    "gamma multiplies phi(k_j) v_j^T in s_i?")
    np.testing.assert_allclose(parallel(q, k, v, 1.0),
                               linattn.linear_attention(q, k, v, causal=True), rtol=1e-10,
                               err_msg="gamma = 1 must be causal linear attention")
    heads = rng.standard_normal((3, 4, d))                    # q_i, k_i (4 heads, D)
    out, S, z = step(heads[0], heads[1], heads[2][:, :m], np.zeros((4, d, m)),
                     np.zeros((4, d)), 0.9)
    assert out.shape == (4, m) and S.shape == (4, d, m) and z.shape == (4, d), (
        "leading axes are heads: q_i (4, D) gives out (4, M), S (4, F, M), z (4, F)")


def check_exercise_2(decayed_step, decayed_attention_parallel):
    """decayed_step(q_i, k_i, v_i, S, z, gamma, eps=1e-6) -> (out_i, S, z);
    decayed_attention_parallel(q, k, v, gamma, eps=1e-6) -> out (N, M)."""
    return report(2, _check_2, decayed_step, decayed_attention_parallel)
