"""Checks of notebook 08's exercises, the chunked scan of the CUDA kernels: causal linear
attention, Eq. (9)-(12) of Katharopoulos et al. (2020), arXiv:2006.16236, and its gradients,
Eq. (13)-(15), chunk by chunk. All in NumPy: no GPU is needed.

1. ``fn(x)``: the reverse exclusive prefix over chunks, axis 1 of (H, NC, ...).
2. ``fn(dout, phi_k, v, C)``: d phi(Q) of the causal numerator, chunk by chunk.
3. ``fn(dout, phi_q, phi_k, C)``: dV of the causal numerator, chunk by chunk.

``check_exercise_N(answer)`` prints "Exercise N: correct", raises AssertionError saying what
is wrong, or says the answer is not attempted yet while it raises NotImplementedError.
"""
import numpy as np

from linattn.forms import cumulative

from ._exercises import report

RAGGED = ((10, 4), (8, 8), (13, 5), (1, 3), (9, 2))       # (N, C), most with a short chunk


def _reverse_scan(fn):
    x = np.random.default_rng(0).standard_normal((2, 5, 3, 2))
    got = fn(x)
    assert np.shape(got) == x.shape, f"one entry per chunk, {x.shape}"
    want = np.stack([x[:, c + 1:].sum(axis=1) for c in range(5)], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15,
                               err_msg="out[:, c] = sum over c' > c of x[:, c'] (the last "
                                       "chunk gets 0)")


def check_exercise_1(fn):
    report(1, _reverse_scan, fn)


def _numerator_case(rng, n):
    phi_q, phi_k = np.exp(rng.standard_normal((2, n, 3)))
    v, dout = rng.standard_normal((2, n, 2))
    return dout, phi_q, phi_k, v


def _chunked_dq(fn):
    rng = np.random.default_rng(2)
    for n, c in RAGGED:
        dout, phi_q, phi_k, v = _numerator_case(rng, n)
        want = cumulative.product_backward(dout, phi_q, phi_k, v, causal=True)[0]
        np.testing.assert_allclose(fn(dout, phi_k, v, c), want, rtol=1e-12, atol=1e-12,
                                   err_msg=f"N = {n}, chunks of {c}")


def check_exercise_2(fn):
    report(2, _chunked_dq, fn)


def _chunked_dv(fn):
    rng = np.random.default_rng(3)
    for n, c in RAGGED:
        dout, phi_q, phi_k, v = _numerator_case(rng, n)
        want = cumulative.product_backward(dout, phi_q, phi_k, v, causal=True)[2]
        np.testing.assert_allclose(fn(dout, phi_q, phi_k, c), want, rtol=1e-12, atol=1e-12,
                                   err_msg=f"N = {n}, chunks of {c}")


def check_exercise_3(fn):
    report(3, _chunked_dv, fn)
