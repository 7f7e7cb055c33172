"""Softmax attention in NumPy, the O(N^2) baseline and its oracle: Eq. (2) of Katharopoulos
et al. (2020), arXiv:2006.16236, with the causal mask of Eq. (8), sim(q, k) =
exp(q.k / sqrt(D)).

This form builds the (..., Nq, Nk) matrix of probabilities; it is the reference the Numba
(``numba_cpu.softmax``) and CUDA (``cuda.softmax``) kernels are tested against, and itself is
held to a line-by-line transcription of Eq. (3) and to central finite differences.
It runs on NumPy and CuPy arrays alike.
"""
from .._checks import array_module

SUPPORTS = frozenset({"non_causal", "key_mask"})  # options taken by keyword (dispatch)


def probabilities(q, k, causal, scale, key_mask=None):
    """The attention matrix P = softmax(scale * q k^T), shape (..., Nq, Nk); a padded key
    (``key_mask`` (..., Nk) False) gets probability 0, and a row whose keys are all padded
    is 0 (it attends to nothing), not 0 / 0."""
    xp = array_module(q)
    if key_mask is not None:
        k = xp.where(key_mask[..., None], k, k.dtype.type(0))  # padding may hold NaN
    logits = (q @ k.swapaxes(-1, -2)) * q.dtype.type(scale)  # (..., Nq, Nk)
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        return logits  # no rows, or no keys (only with no queries: _checks): nothing to do
    if causal:
        n = q.shape[-2]
        logits = xp.where(xp.tril(xp.ones((n, n), dtype=bool)), logits, -xp.inf)
    if key_mask is not None:
        logits = xp.where(key_mask[..., None, :], logits, -xp.inf)
    # subtracting the row maximum makes exp() overflow-free; the diagonal keeps every
    # causal row finite. A NaN query row gives a NaN maximum and stays NaN. A row of
    # padded keys only has maximum -inf: shifted by 0, its exp() and its sum are 0.
    top = logits.max(axis=-1, keepdims=True)
    if key_mask is not None:
        top = xp.where(top == -xp.inf, top.dtype.type(0), top)
    p = xp.exp(logits - top)
    total = p.sum(axis=-1, keepdims=True)
    if key_mask is not None:
        total = xp.where(total == 0, total.dtype.type(1), total)
    return p / total


def attend(q, k, v, *, causal, scale, key_mask=None):
    """out = P v with P = softmax(scale q k^T), Eq. (2) / (8); padded keys (``key_mask``
    False) get no weight.
    Shapes: q (..., Nq, D), k (..., Nk, D), v (..., Nk, M) -> (..., Nq, M).
    Cost: O(Nq Nk max(D, M)) time, O(Nq Nk) memory.
    """
    return probabilities(q, k, causal, scale, key_mask) @ _real(v, key_mask)


def _real(v, key_mask):
    """v with the rows of padded keys 0 (a padded NaN would reach out through 0 * NaN)."""
    if key_mask is None:
        return v
    return array_module(v).where(key_mask[..., None], v, v.dtype.type(0))


def attend_backward(dout, q, k, v, *, causal, scale, key_mask=None):
    """(dq, dk, dv) of ``attend``: with P = softmax(L), L = scale q k^T, out = P v,
    dv = P^T dout, dP = dout v^T, dL = P * (dP - rowsum(dP * P)), dq = scale dL k,
    dk = scale dL^T q. Shapes as q, k, v; O(Nq Nk) memory. Padded keys' columns of P are 0,
    so their dk and dv are exactly 0."""
    xp = array_module(q)
    p = probabilities(q, k, causal, scale, key_mask)        # (..., Nq, Nk)
    v = _real(v, key_mask)
    if key_mask is not None:
        k = xp.where(key_mask[..., None], k, k.dtype.type(0))
    dv = p.swapaxes(-1, -2) @ dout                          # (..., Nk, M)
    dp = dout @ v.swapaxes(-1, -2)                          # (..., Nq, Nk)
    dlogits = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * q.dtype.type(scale)
    dq = dlogits @ k                                        # (..., Nq, D)
    dk = dlogits.swapaxes(-1, -2) @ q                       # (..., Nk, D)
    return dq, dk, dv
