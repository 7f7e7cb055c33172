"""``method="chunked"`` on the Numba backend: the products of ``normaliser`` as matrix products
(BLAS through NumPy's matmul), Eq. (9)-(12) of Katharopoulos et al. (2020), arXiv:2006.16236,
in blocks of C = ``chunk_size`` positions.

For blocks b with A_b, C_b (C, A), B_b (C, B) and the state entering block b,
S_b = sum_{c < b} A_c^T B_c (a prefix over blocks, one compiled pass):
    out_b = tril(C_b A_b^T) B_b + C_b S_b.
Non-causal, S = A^T B over all positions and out = C S: two matrix products, which is what
the Numba backend runs by default then (see ``numba_cpu._form`` for the measurements).
The normaliser is one more column of ones in B. Oracle: ``forms.quadratic``.
"""
import functools

import numpy as np
from numba import njit

from . import normaliser


def _blocks(x, c):
    """(R, N, W) -> (R, nb, C, W), zero-padded to nb = ceil(N / C) blocks."""
    rows, n, width = x.shape
    nb = -(-n // c)
    padded = np.zeros((rows, nb * c, width), dtype=x.dtype)
    padded[:, :n] = x
    return padded.reshape(rows, nb, c, width)


@njit(cache=True, error_model="numpy")
def _exclusive_prefix_(kv):
    """kv[:, b] <- sum_{c < b} kv[:, c] in place, over axis 1 of (R, nb, A, B)."""
    rows, nb = kv.shape[:2]
    flat = kv.reshape(rows, nb, -1)
    for r in range(rows):
        total = np.zeros(flat.shape[2], dtype=kv.dtype)
        for b in range(nb):
            for e in range(flat.shape[2]):
                total[e], flat[r, b, e] = total[e] + flat[r, b, e], total[e]


@njit(cache=True, error_model="numpy")
def _tril_(scores):
    """Zero above the diagonal of each (C, C) block, in place (assigned: NaN * 0 is NaN)."""
    c = scores.shape[-1]
    flat = scores.reshape(-1, c, c)
    zero = scores.dtype.type(0)
    for blk in range(flat.shape[0]):
        for i in range(c):
            for j in range(i + 1, c):
                flat[blk, i, j] = zero


def product(a, b, c, *, reverse, eps, out, den, chunk_size):
    """The (normalised) product of ``normaliser`` by blocked matrix products.

    Cost: O(N C (A + B) + N A B) time, O(N (C + A B / C)) memory.
    """
    n, width_b = a.shape[1], out.shape[-1]
    b = b[..., :width_b]
    if eps is not None:                                  # normaliser: one column of ones
        b = np.concatenate([b, np.ones((*b.shape[:-1], 1), dtype=b.dtype)], axis=-1)
    if chunk_size is None:                               # non-causal: all positions at once
        num = c @ (a.swapaxes(-1, -2) @ b)               # Eq. (6), (R, N, B + 1)
    else:
        if reverse:                                      # j >= i: run the sums backwards
            a, b, c = a[:, ::-1], b[:, ::-1], c[:, ::-1]
        ab, bb, cb = (_blocks(x, chunk_size) for x in (a, b, c))   # (R, nb, C, W)
        kv = ab.swapaxes(-1, -2) @ bb                    # (R, nb, A, B): each block's A^T B
        _exclusive_prefix_(kv)                           # S_b, the state entering block b
        scores = cb @ ab.swapaxes(-1, -2)                # (R, nb, C, C)
        _tril_(scores)
        num = scores @ bb + cb @ kv                      # Eq. (9) within and across blocks
        num = num.reshape(num.shape[0], -1, num.shape[-1])[:, :n]
        if reverse:
            num = num[:, ::-1]
    if eps is None:
        out[...] = num
    else:
        den[...] = num[..., -1] + eps
        np.divide(num[..., :-1], den[..., None], out=out)


def attend(phi_q, phi_k, v, *, causal, eps, chunk_size=64, elu=False):
    """Normalised linear attention, Eq. (5) / (9)-(12), by blocked matrix products.
    Shapes (..., N, F), (..., N, M) -> (..., N, M); raw q, k with ``elu``."""
    return normaliser.attend(_product(causal, chunk_size), phi_q, phi_k, v, eps, elu)


def attend_backward(dout, phi_q, phi_k, v, *, causal, eps, chunk_size=64, elu=False):
    """Backward of ``attend``: (dphi_q, dphi_k, dv), or (dq, dk, dv) with ``elu``."""
    return normaliser.attend_backward(_product(causal, chunk_size), dout, phi_q, phi_k, v,
                                      eps, elu)


def _product(causal, chunk_size):
    """``product`` with its block length bound; None (one block of everything) if not causal."""
    return functools.partial(product, chunk_size=chunk_size if causal else None)
