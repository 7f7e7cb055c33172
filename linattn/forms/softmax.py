"""Softmax attention in NumPy, the O(N^2) baseline and its oracle: Eq. (2) of Katharopoulos
et al. (2020), arXiv:2006.16236, with the causal mask of Eq. (8), sim(q, k) =
exp(q.k / sqrt(D)).

This form builds the (..., Nq, Nk) matrix of probabilities; it is the reference the Numba
(``numba_cpu.softmax``) and CUDA (``cuda.softmax``) kernels are tested against, and itself is
held to a line-by-line transcription of Eq. (3) and to central finite differences.
It runs on NumPy and CuPy arrays alike.
"""
from .._checks import array_module

SUPPORTS = frozenset({"non_causal"})  # options taken by keyword (dispatch)


def probabilities(q, k, causal, scale):
    """The attention matrix P = softmax(scale * q k^T), shape (..., Nq, Nk)."""
    xp = array_module(q)
    logits = (q @ k.swapaxes(-1, -2)) * q.dtype.type(scale)  # (..., Nq, Nk)
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        return logits  # no rows, or no keys (only with no queries: _checks): nothing to do
    if causal:
        n = q.shape[-2]
        logits = xp.where(xp.tril(xp.ones((n, n), dtype=bool)), logits, -xp.inf)
    # subtracting the row maximum makes exp() overflow-free; the diagonal keeps every
    # causal row finite. A NaN query row gives a NaN maximum and stays NaN.
    logits = logits - logits.max(axis=-1, keepdims=True)
    p = xp.exp(logits)
    return p / p.sum(axis=-1, keepdims=True)


def attend(q, k, v, *, causal, scale):
    """out = P v with P = softmax(scale q k^T), Eq. (2) / (8).

    Shapes: q (..., Nq, D), k (..., Nk, D), v (..., Nk, M) -> (..., Nq, M).
    Cost: O(Nq Nk max(D, M)) time, O(Nq Nk) memory.
    """
    return probabilities(q, k, causal, scale) @ v


def attend_backward(dout, q, k, v, *, causal, scale):
    """(dq, dk, dv) of ``attend``: with P = softmax(L), L = scale q k^T, out = P v,
    dv = P^T dout, dP = dout v^T, dL = P * (dP - rowsum(dP * P)), dq = scale dL k,
    dk = scale dL^T q. Shapes as q, k, v; O(Nq Nk) memory."""
    p = probabilities(q, k, causal, scale)                 # (..., Nq, Nk)
    dv = p.swapaxes(-1, -2) @ dout                          # (..., Nk, M)
    dp = dout @ v.swapaxes(-1, -2)                          # (..., Nq, Nk)
    dlogits = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * q.dtype.type(scale)
    dq = dlogits @ k                                        # (..., Nq, D)
    dk = dlogits.swapaxes(-1, -2) @ q                       # (..., Nk, D)
    return dq, dk, dv
