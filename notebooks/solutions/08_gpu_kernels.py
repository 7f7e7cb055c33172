"""Exercise solutions and checks for notebook 08, the chunked scan of the CUDA kernels.

Katharopoulos et al. (2020), arXiv:2006.16236: causal linear attention, Eq. (9)-(12), and
its gradients, Eq. (13)-(15), computed chunk by chunk as ``linattn/cuda/causal_product.cu``
does. All in NumPy: no GPU is needed.

1. ``reverse_exclusive_scan``: the state that enters chunk c from the right in the backward
   pass, G_c = sum over later chunks c' > c.
2. ``tile_by_threads``: one TILE x TILE product tile computed thread by thread, each thread
   owning an r x r block of outputs.
3. ``chunked_dv``: the gradient dV of the causal numerator, chunk by chunk, Eq. (15).

Each ``check_exercise_N(fn)`` prints the verdict and returns True when fn is right (False
while it raises NotImplementedError); a wrong answer fails an assertion.
"""
import numpy as np

from linattn.forms import cumulative

from checks._exercises import attempter

_attempt = attempter(__file__)


def reverse_exclusive_scan(x):
    """Exercise 1: out[:, c] = sum_{c' > c} x[:, c'] for x (H, NC, ...)."""
    out = np.zeros_like(x)
    for c in range(x.shape[1] - 2, -1, -1):            # the backward pass walks right to left
        out[:, c] = out[:, c + 1] + x[:, c + 1]
    return out


def tile_by_threads(a, b, r):
    """Exercise 2: a.T @ b for a, b (K, T), computed by (T / r)^2 threads, thread
    t = (ty, tx) owning rows ty*r.. and columns tx*r.. of the T x T result."""
    t_width = a.shape[1]
    side = t_width // r                                  # threads per side
    tile = np.zeros((t_width, t_width), dtype=np.result_type(a, b))
    for t in range(side * side):
        ty, tx = divmod(t, side)
        rows, cols = slice(ty * r, ty * r + r), slice(tx * r, tx * r + r)
        tile[rows, cols] = a[:, rows].T @ b[:, cols]     # this thread's registers
    return tile


def chunked_dv(dout, phi_q, phi_k, chunk_size):
    """Exercise 3: dV of out = tril(phi_q phi_k^T) v, chunk by chunk, shapes (N, F), (N, M).

    dV_j = sum_{i >= j} (phi_q_i . phi_k_j) dout_i: within chunk c the masked block
    A_c^T dout_c, from later chunks phi_k_c G_c with G_c = sum_{c' > c} phi_q_c'^T dout_c'.
    """
    n = dout.shape[0]
    starts = range(0, n, chunk_size)
    parts = np.stack([phi_q[s:s + chunk_size].T @ dout[s:s + chunk_size] for s in starts])
    later = reverse_exclusive_scan(parts[None])[0]      # G_c, (NC, F, M)
    dv = np.empty_like(dout)
    for c, s in enumerate(starts):
        b = slice(s, s + chunk_size)
        a = np.tril(phi_q[b] @ phi_k[b].T)               # (C, C): j <= i in the chunk
        dv[b] = a.T @ dout[b] + phi_k[b] @ later[c]
    return dv



def check_exercise_1(fn):
    """True when fn is the reverse exclusive prefix over chunks (axis 1)."""
    x = np.random.default_rng(0).standard_normal((2, 5, 3, 2))
    got = _attempt(1, fn, x)
    if got is None:
        return False
    want = np.stack([x[:, c + 1:].sum(axis=1) for c in range(5)], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    print("exercise 1: right")
    return True


def check_exercise_2(fn):
    """True when fn(a, b, r) equals a.T @ b for several thread layouts."""
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 24, 16))
    for r in (1, 2, 4, 8):
        got = _attempt(2, fn, a, b, r)
        if got is None:
            return False
        np.testing.assert_allclose(got, a.T @ b, rtol=1e-12, atol=1e-12)
    print("exercise 2: right for 1 x 1 to 8 x 8 outputs per thread")
    return True


def check_exercise_3(fn):
    """True when fn(dout, phi_q, phi_k, C) is the causal numerator's dV, for ragged N."""
    rng = np.random.default_rng(2)
    for n, c in ((10, 4), (8, 8), (13, 5), (1, 3)):
        phi_q, phi_k = np.exp(rng.standard_normal((2, n, 3)))
        v, dout = rng.standard_normal((2, n, 2))
        got = _attempt(3, fn, dout, phi_q, phi_k, c)
        if got is None:
            return False
        want = cumulative.product_backward(dout, phi_q, phi_k, v, causal=True)[2]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    print("exercise 3: right, equals the running sums' dV for N = 1 to 13")
    return True
