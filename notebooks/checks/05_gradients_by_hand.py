"""Checks of the exercises of notebook 05 (gradients by hand). Each ``check_exercise_N``
prints "Exercise N: correct", raises AssertionError saying what is wrong, or says the exercise
is not attempted yet while the answer raises NotImplementedError."""
import numpy as np

import linattn

from ._exercises import assert_below_n_by_n, report


def finite_differences(f, arrays, dout, h=1e-6):
    """Central differences of l = sum(f(*arrays) * dout), one entry at a time."""
    grads = []
    for a in arrays:
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            old = a[idx]
            a[idx] = old + h
            plus = np.sum(f(*arrays) * dout)
            a[idx] = old - h
            minus = np.sum(f(*arrays) * dout)
            a[idx] = old
            g[idx] = (plus - minus) / (2 * h)
        grads.append(g)
    return grads


def _data(seed, n=5, d=3, m=2):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, m)), rng.standard_normal((n, d)),
            rng.standard_normal((n, d)), rng.standard_normal((n, m)))


# ---- Exercise 1: relu's backward, and a query that gets no gradient -------------------------

def _check_1(relu_vjp, prediction):
    rng = np.random.default_rng(0)
    x, dphi = rng.standard_normal((2, 6, 4))
    x[np.abs(x) < 1e-3] = 0.5                          # away from the kink
    got = relu_vjp(x, dphi)
    by_differences = finite_differences(lambda a: np.maximum(a, 0), [x.copy()], dphi)[0]
    np.testing.assert_allclose(got, by_differences, atol=1e-6,
                               err_msg="relu_vjp: not the derivative of max(x, 0) times dphi")
    dout, q, k, v = _data(9)
    q[2] = -np.abs(q[2]) - 0.1                         # query 2: every coordinate < 0
    out = linattn.linear_attention(q, k, v, feature_map="relu")
    dq, _, _ = linattn.linear_attention_backward(dout, q, k, v, feature_map="relu")
    predicted_out, predicted_dq = prediction()
    for name, guess, actual in (("output", predicted_out, out[2]), ("dq", predicted_dq, dq[2])):
        assert np.allclose(actual, guess, rtol=1e-6, atol=1e-9), (
            f"you predicted every entry of the dead query's {name} row is {guess}; "
            "think again: phi(q) = 0, the normaliser is eps alone, and relu's derivative is "
            "0 wherever x < 0")


def check_exercise_1(relu_vjp, dead_query_prediction):
    """relu_vjp(x, dphi) -> dx; dead_query_prediction() -> (output entry, dq entry)."""
    return report(1, _check_1, relu_vjp, dead_query_prediction)


# ---- Exercise 2: the softmax backward in tiles of keys --------------------------------------

def _check_2(backward):
    for seed, n_q, n_k, tile in ((1, 5, 5, 2), (2, 4, 9, 4), (3, 6, 6, 64)):
        rng = np.random.default_rng(seed)
        q, k = rng.standard_normal((n_q, 3)), rng.standard_normal((n_k, 3))
        v, dout = rng.standard_normal((n_k, 2)), rng.standard_normal((n_q, 2))
        for scale in (1.0, 20.0):            # 20: logits past exp's range for seeds 2 and 3
            want = linattn.softmax_attention_backward(dout, scale * q, scale * k, v,
                                                      backend="numpy")
            got = backward(dout, scale * q, scale * k, v, tile)
            for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
                assert np.shape(g) == w.shape, f"{name}: shape {np.shape(g)}, want {w.shape}"
                np.testing.assert_allclose(
                    g, w, rtol=1e-9, atol=1e-10,
                    err_msg=f"{name}, Nq = {n_q}, Nk = {n_k}, tile = {tile}, logits x{scale}")
    rng = np.random.default_rng(4)
    n, tile = 4096, 64
    q, k, v, dout = rng.standard_normal((4, n, 16))
    assert_below_n_by_n(lambda: backward(dout, q, k, v, tile), n, ", tile = 64", 1 / 2,
                        "the peak memory is that of an N x N array: recompute P one "
                        "tile of keys at a time from each row's log-sum-exp")


def check_exercise_2(softmax_attention_backward_tiled):
    """softmax_attention_backward_tiled(dout, q, k, v, tile) -> (dq, dk, dv)."""
    return report(2, _check_2, softmax_attention_backward_tiled)


# ---- Exercise 3: the non-causal linear attention backward -----------------------------------

def _check_3(backward):
    dout, q, k, v = _data(2)
    got = backward(dout, q, k, v)
    want = linattn.linear_attention_backward(dout, q, k, v, causal=False, eps=1e-6,
                                             backend="numpy")
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12,
                                   err_msg=f"{name}: not linear_attention_backward's")
    attention = lambda a, b, c: linattn.linear_attention(a, b, c, eps=1e-6)  # noqa: E731
    for name, g, w in zip(("dq", "dk", "dv"), got,
                          finite_differences(attention, [q.copy(), k.copy(), v.copy()], dout)):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-8,
                                   err_msg=f"{name}: not the finite differences")


def check_exercise_3(linear_attention_backward_noncausal):
    """linear_attention_backward_noncausal(dout, q, k, v) -> (dq, dk, dv), elu + 1, eps 1e-6."""
    return report(3, _check_3, linear_attention_backward_noncausal)
