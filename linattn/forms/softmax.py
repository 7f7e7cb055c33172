"""Softmax attention in NumPy, the O(N^2) baseline and its oracle: Eq. (2) of Katharopoulos
et al. (2020), arXiv:2006.16236, with the causal mask of Eq. (8), sim(q, k) =
exp(q.k / sqrt(D)).

This form builds the (..., Nq, Nk) matrix of probabilities; it is the reference the Numba
(``numba_cpu.softmax``) and CUDA (``cuda.softmax``) kernels are tested against, and itself is
held to a line-by-line transcription of Eq. (3) and to central finite differences.
It runs on NumPy and CuPy arrays alike.

The log-sum-exp of each query's logits, lse_i = log sum_j exp(L_ij) over the keys it sees,
is what the forward can return (``return_lse``) and the backward can take with the output
(``out``, ``lse``): then P = exp(L - lse) and rowsum(dP * P) = dout . out, as the tiled
kernels compute them, instead of a second softmax.
"""
from .._checks import array_module

SUPPORTS = frozenset({"non_causal", "key_mask", "lse"})  # options taken by keyword (dispatch)


def logits(q, k, causal, scale, key_mask=None):
    """L = scale * q k^T, shape (..., Nq, Nk), -inf where a query may not look: above the
    diagonal if ``causal``, at padded keys (``key_mask`` (..., Nk) False)."""
    xp = array_module(q)
    if key_mask is not None:
        k = xp.where(key_mask[..., None], k, k.dtype.type(0))  # padding may hold NaN
    out = (q @ k.swapaxes(-1, -2)) * q.dtype.type(scale)    # (..., Nq, Nk)
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        return out  # no rows, or no keys (only with no queries: _checks): nothing to mask
    if causal:
        n = q.shape[-2]
        out = xp.where(xp.tril(xp.ones((n, n), dtype=bool)), out, -xp.inf)
    if key_mask is not None:
        out = xp.where(key_mask[..., None, :], out, -xp.inf)
    return out


def probabilities(q, k, causal, scale, key_mask=None, return_lse=False):
    """The attention matrix P = softmax(scale * q k^T), shape (..., Nq, Nk); a padded key
    (``key_mask`` (..., Nk) False) gets probability 0, and a row whose keys are all padded
    is 0 (it attends to nothing), not 0 / 0. With ``return_lse``, (P, lse): lse (..., Nq)
    the log of each row's sum of exp(L), -inf for a row of padded keys only (log 0)."""
    xp = array_module(q)
    scores = logits(q, k, causal, scale, key_mask)
    if scores.shape[-1] == 0:                                # no keys, so no queries
        return (scores, scores.sum(axis=-1)) if return_lse else scores
    # subtracting the row maximum makes exp() overflow-free; the diagonal keeps every
    # causal row finite. A NaN query row gives a NaN maximum and stays NaN. A row of
    # padded keys only has maximum -inf: shifted by 0, its exp() and its sum are 0.
    top = scores.max(axis=-1, keepdims=True)
    if key_mask is not None:
        top = xp.where(top == -xp.inf, top.dtype.type(0), top)
    p = xp.exp(scores - top)
    total = p.sum(axis=-1, keepdims=True)
    empty = total == 0                                       # a row of padded keys only
    if key_mask is not None:
        total = xp.where(empty, total.dtype.type(1), total)
    p = p / total
    if not return_lse:
        return p
    lse = xp.where(empty, -xp.inf, top + xp.log(total))[..., 0]
    return p, lse.astype(p.dtype, copy=False)


def attend(q, k, v, *, causal, scale, key_mask=None, return_lse=False):
    """out = P v with P = softmax(scale q k^T), Eq. (2) / (8); padded keys (``key_mask``
    False) get no weight. With ``return_lse``, (out, lse), lse as ``probabilities`` gives it.
    Shapes: q (..., Nq, D), k (..., Nk, D), v (..., Nk, M) -> (..., Nq, M) (and (..., Nq)).
    Cost: O(Nq Nk max(D, M)) time, O(Nq Nk) memory.
    """
    if return_lse:
        p, lse = probabilities(q, k, causal, scale, key_mask, return_lse=True)
        return p @ _real(v, key_mask), lse
    return probabilities(q, k, causal, scale, key_mask) @ _real(v, key_mask)


def _real(v, key_mask):
    """v with the rows of padded keys 0 (a padded NaN would reach out through 0 * NaN)."""
    if key_mask is None:
        return v
    return array_module(v).where(key_mask[..., None], v, v.dtype.type(0))


def attend_backward(dout, q, k, v, *, causal, scale, key_mask=None, out=None, lse=None):
    """(dq, dk, dv) of ``attend``: with P = softmax(L), L = scale q k^T, out = P v,
    dv = P^T dout, dP = dout v^T, dL = P * (dP - rowsum(dP * P)), dq = scale dL k,
    dk = scale dL^T q. Shapes as q, k, v; O(Nq Nk) memory. Padded keys' columns of P are 0,
    so their dk and dv are exactly 0.

    Given the forward's ``out`` (..., Nq, M) and ``lse`` (..., Nq) (``attend`` with
    ``return_lse``), P is rebuilt as exp(L - lse) and rowsum(dP * P) as rowsum(dout * out)
    (P v = out), the tiled kernels' way; the gradients are the same."""
    xp = array_module(q)
    if lse is None:
        p = probabilities(q, k, causal, scale, key_mask)    # (..., Nq, Nk)
    else:
        shift = xp.where(lse == -xp.inf, lse.dtype.type(0), lse)   # a row of padding: P = 0
        p = xp.exp(logits(q, k, causal, scale, key_mask) - shift[..., None])
    v = _real(v, key_mask)
    if key_mask is not None:
        k = xp.where(key_mask[..., None], k, k.dtype.type(0))
    dv = p.swapaxes(-1, -2) @ dout                          # (..., Nk, M)
    dp = dout @ v.swapaxes(-1, -2)                          # (..., Nq, Nk)
    rowsum = (dp * p if lse is None else dout * out).sum(axis=-1, keepdims=True)
    dlogits = p * (dp - rowsum) * q.dtype.type(scale)
    dq = dlogits @ k                                        # (..., Nq, D)
    dk = dlogits.swapaxes(-1, -2) @ q                       # (..., Nk, D)
    return dq, dk, dv
