"""Exercise solutions and checks for notebook 05, gradients by hand.

Katharopoulos et al. (2020), arXiv:2006.16236: the backward passes of softmax attention,
Eq. (2), and of linear attention with its normaliser, Eq. (5) and (13)-(15).

1. ``relu_vjp``: the backward pass of the relu feature map.
2. ``causal_softmax_backward``: dq, dk, dv of causal softmax attention.
3. ``linear_attention_backward_noncausal``: dq, dk, dv of non-causal linear attention with
   elu+1 and the normaliser.

Each ``check_exercise_N(fn)`` runs a student's function against the library and finite
differences, prints the verdict, and returns True when it is right (False when the function
still raises NotImplementedError); a wrong answer fails an assertion.
"""
import numpy as np

import linattn

from checks._exercises import attempter

_attempt = attempter(__file__)


def relu_vjp(x, dphi):
    """Exercise 1: dx for phi(x) = max(x, 0), given dphi = dl/dphi."""
    return dphi * (x > 0)


def causal_softmax_backward(dout, q, k, v):
    """Exercise 2: (dq, dk, dv) of causal softmax attention, q, k (N, D), v, dout (N, M)."""
    d = q.shape[-1]
    logits = q @ k.T / np.sqrt(d)
    logits = np.where(np.tril(np.ones(logits.shape, dtype=bool)), logits, -np.inf)  # j <= i
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)                  # masked entries are exactly 0
    dv = p.T @ dout
    dp = dout @ v.T
    dlogits = p * (dp - (p * dp).sum(axis=1, keepdims=True))
    return dlogits @ k / np.sqrt(d), dlogits.T @ q / np.sqrt(d), dv


def linear_attention_backward_noncausal(dout, q, k, v, eps=1e-6):
    """Exercise 3: (dq, dk, dv) of non-causal linear attention with elu+1, Eq. (5)."""
    phi = linattn.EluPlusOne()
    phi_q, phi_k = phi.forward(q), phi.forward(k)
    s, z = phi_k.T @ v, phi_k.sum(axis=0)             # (F, M), (F,)
    den = phi_q @ z + eps                              # (N,)
    out = (phi_q @ s) / den[:, None]
    dnum = dout / den[:, None]                         # through num / den
    dden = -(dout * out).sum(axis=1) / den
    dphi_q = dnum @ s.T + dden[:, None] * z
    ds, dz = phi_q.T @ dnum, phi_q.T @ dden            # (F, M), (F,)
    dphi_k = v @ ds.T + dz
    return phi.vjp(q, dphi_q), phi.vjp(k, dphi_k), phi_k @ ds


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


def check_exercise_1(fn):
    """True when fn(x, dphi) is relu's vector-Jacobian product."""
    rng = np.random.default_rng(0)
    x, dphi = rng.standard_normal((2, 6, 4))
    got = _attempt(1, fn, x, dphi)
    if got is None:
        return False
    np.testing.assert_allclose(got, linattn.ReLU().vjp(x, dphi), rtol=1e-12)
    by_differences = finite_differences(lambda a: np.maximum(a, 0), [x.copy()], dphi)[0]
    np.testing.assert_allclose(got, by_differences, atol=1e-6)
    print("exercise 1: right (zero wherever x < 0: no gradient flows there)")
    return True


def check_exercise_2(fn):
    """True when fn(dout, q, k, v) returns causal softmax attention's gradients."""
    dout, q, k, v = _data(1)
    got = _attempt(2, fn, dout, q, k, v)
    if got is None:
        return False
    want = linattn.softmax_attention_backward(dout, q, k, v, causal=True, backend="numpy")
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    print("exercise 2: right, equals softmax_attention_backward(causal=True)")
    return True


def check_exercise_3(fn):
    """True when fn(dout, q, k, v) returns non-causal linear attention's gradients."""
    dout, q, k, v = _data(2)
    got = _attempt(3, fn, dout, q, k, v)
    if got is None:
        return False
    want = linattn.linear_attention_backward(dout, q, k, v, causal=False, eps=1e-6,
                                             backend="numpy")
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    attention = lambda a, b, c: linattn.linear_attention(a, b, c, eps=1e-6)  # noqa: E731
    for g, w in zip(got, finite_differences(attention, [q.copy(), k.copy(), v.copy()], dout)):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-8)
    print("exercise 3: right, equals linear_attention_backward(causal=False) and the differences")
    return True
