"""Helpers the tests import (``from helpers import random_qkv``): random inputs, central
differences and the relative error the gradient checks compare. Fixtures and the hypothesis
profiles stay in ``conftest.py``.
"""
import tracemalloc

import numpy as np

FEATURE_MAP_NAMES = ("elu+1", "relu", "taylor", "favor")


def random_qkv(seed, n, d, m, lead=(), dtype=np.float64):
    """Random q, k (*lead, n, d) and v (*lead, n, m), standard normal, from ``seed``."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((*lead, n, d)).astype(dtype)
    k = rng.standard_normal((*lead, n, d)).astype(dtype)
    v = rng.standard_normal((*lead, n, m)).astype(dtype)
    return q, k, v


def numerical_gradients(f, arrays, dout, h=1e-6):
    """Central differences of sum(f(*arrays) * dout) with respect to each array (float64)."""
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


def numerical_parameter_gradients(params, loss, h=1e-6):
    """{name: central differences of ``loss()`` with respect to each array of the dict
    ``params``}, each entry nudged in place and restored (float64)."""
    grads = {}
    for name, a in params.items():
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            old = a[idx]
            a[idx] = old + h
            plus = loss()
            a[idx] = old - h
            minus = loss()
            a[idx] = old
            g[idx] = (plus - minus) / (2 * h)
        grads[name] = g
    return grads


def peak_traced_bytes(f, *args, **kw):
    """The peak of the memory tracemalloc traces while ``f(*args, **kw)`` runs: NumPy's
    arrays, and Numba's (its runtime allocates through PyMem_RawMalloc)."""
    tracemalloc.start()
    try:
        f(*args, **kw)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def relative_error(got, want):
    """max |got - want| / max(|want|, tiny): one number per comparison, as cs231n does."""
    scale = max(np.max(np.abs(want), initial=0.0), 1e-12)
    return np.max(np.abs(got - want), initial=0.0) / scale


def assert_gradients_match(f, f_backward, arrays, seed=0, tol=1e-6):
    """Hold ``f_backward(dout, *arrays)`` to central differences of sum(f(*arrays) * dout)."""
    arrays = [np.array(a, dtype=np.float64) for a in arrays]
    dout = np.random.default_rng(seed).standard_normal(np.shape(f(*arrays)))
    want = numerical_gradients(f, arrays, dout)
    got = f_backward(dout, *arrays)
    assert len(got) == len(arrays)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, (i, g.shape, w.shape)
        err = relative_error(g, w)
        assert err < tol, f"gradient {i}: relative error {err:.2e}"


def assert_lsh_backends_agree(qk, v, dout, **kw):
    """LSH attention and its backward on Numba equal NumPy's, float64 to rtol 1e-10."""
    from linattn import lsh_attention, lsh_attention_backward
    np.testing.assert_allclose(lsh_attention(qk, v, backend="numba", **kw),
                               lsh_attention(qk, v, backend="numpy", **kw),
                               rtol=1e-10, atol=1e-12)
    got = lsh_attention_backward(dout, qk, v, backend="numba", **kw)
    want = lsh_attention_backward(dout, qk, v, backend="numpy", **kw)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


# A notebook cell's limit in the tests: it guards against a hung kernel, not a slow machine
# (notebook 12's training cell took over two minutes on a busy 2-core box).
CELL_TIMEOUT_S = 900
