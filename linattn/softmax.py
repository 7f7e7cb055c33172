"""Softmax attention, the O(N^2) baseline: Eq. (2) of Katharopoulos et al. (2020),
"Transformers are RNNs", arXiv:2006.16236, with its causal mask, Eq. (8) with
sim(q, k) = exp(q.k / sqrt(D)).

Reference: the NumPy functions here are their own oracle; tests hold them to a line-by-line
transcription of Eq. (3) and the backward to central finite differences. ``backend="numba"``
runs ``numba_cpu.softmax``, which never holds the N x N matrix; this module is its oracle.
"""
from ._checks import BACKENDS, array_module, check_choice, check_qkv, resolve_backend
from .cuda import launch as cuda_launch, softmax as cuda_softmax


def _probabilities(q, k, causal, scale):
    """The attention matrix P = softmax(scale * q k^T), shape (..., N, N)."""
    xp = array_module(q)
    logits = (q @ k.swapaxes(-1, -2)) * q.dtype.type(scale)  # (..., N, N)
    if q.shape[-2] == 0:
        return logits  # N = 0: an empty (..., 0, 0) matrix, no row to normalise
    if causal:
        n = q.shape[-2]
        logits = xp.where(xp.tril(xp.ones((n, n), dtype=bool)), logits, -xp.inf)
    # subtracting the row maximum makes exp() overflow-free; the diagonal keeps every
    # causal row finite. A NaN query row gives a NaN maximum and stays NaN.
    logits = logits - logits.max(axis=-1, keepdims=True)
    p = xp.exp(logits)
    return p / p.sum(axis=-1, keepdims=True)


def _scale(q, scale):
    return q.shape[-1] ** -0.5 if scale is None else float(scale)


def attend(q, k, v, *, causal, scale):
    """The NumPy forward on validated arrays: P v with P = softmax(scale q k^T)."""
    return _probabilities(q, k, causal, scale) @ v


def attend_backward(dout, q, k, v, *, causal, scale):
    """The NumPy backward on validated arrays: (dq, dk, dv) as documented below."""
    p = _probabilities(q, k, causal, scale)                 # (..., N, N)
    dv = p.swapaxes(-1, -2) @ dout                          # (..., N, M)
    dp = dout @ v.swapaxes(-1, -2)                          # (..., N, N)
    dlogits = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * q.dtype.type(scale)
    dq = dlogits @ k                                        # (..., N, D)
    dk = dlogits.swapaxes(-1, -2) @ q                       # (..., N, D)
    return dq, dk, dv


def _kernel(backend, xp):
    """(attend, attend_backward) for ``backend``: ``linattn.cuda.softmax`` for "cupy" (and
    "auto" with CuPy arrays), ``numba_cpu.softmax`` for "numba" (and "auto" when numba
    imports), the NumPy pair above otherwise."""
    check_choice("backend", backend, BACKENDS)
    if cuda_launch.wants_cupy(backend, xp):
        return cuda_softmax.softmax_attention, cuda_softmax.softmax_attention_backward
    if resolve_backend(backend, xp) == "numba":
        from .numba_cpu import softmax as numba_softmax  # compiled: imported on first use
        return numba_softmax.attend, numba_softmax.attend_backward
    return attend, attend_backward


def softmax_attention(q, k, v, *, causal=False, scale=None, backend="auto"):
    """Softmax attention, the O(N^2) baseline, Eq. (2).

    out = softmax(scale * q k^T) v row by row, scale = 1/sqrt(D) by default;
    if causal, row i sees only j <= i (Eq. 8).

    Parameters
    ----------
    q, k : ndarray, shape (..., N, D)
    v : ndarray, shape (..., N, M)
    causal : bool
    scale : float, optional
    backend : {"auto", "numpy", "numba", "cupy"}
        "cupy" (and "auto" with CuPy arrays) runs ``linattn.cuda.softmax``; "numba" (and
        "auto" when numba imports) streams one row of logits at a time, O(N) memory per
        worker; "numpy" builds the N x N matrix.

    Returns
    -------
    out : ndarray, shape (..., N, M), in the inputs' dtype (float16 is computed in float32).

    Cost: O(N^2 max(D, M)) time; O(N^2) memory on NumPy, O(N) per worker on Numba.
    """
    (q, k, v), out_dtype = check_qkv(q, k, v)
    forward, _ = _kernel(backend, array_module(q))
    out = forward(q, k, v, causal=causal, scale=_scale(q, scale))
    return out.astype(out_dtype, copy=False)


def softmax_attention_backward(dout, q, k, v, *, causal=False, scale=None, backend="auto"):
    """Gradients of softmax attention: the backward of Eq. (2).

    With P = softmax(L), L = scale * q k^T and out = P v:
    dv = P^T dout, dP = dout v^T, dL = P * (dP - rowsum(dP * P)),
    dq = scale * dL k, dk = scale * dL^T q.

    Parameters
    ----------
    dout : ndarray, shape (..., N, M)
        Gradient of the loss with respect to ``out``.
    q, k, v, causal, scale, backend
        As given to ``softmax_attention``.

    Returns
    -------
    dq, dk : ndarray, shape (..., N, D)
    dv : ndarray, shape (..., N, M)

    Cost: O(N^2 max(D, M)) time; O(N^2) memory on NumPy, O(N) per worker on Numba
    (P is recomputed, not stored).
    """
    (q, k, v, dout), out_dtype = check_qkv(q, k, v, dout)
    _, backward = _kernel(backend, array_module(q))
    grads = backward(dout, q, k, v, causal=causal, scale=_scale(q, scale))
    return tuple(g.astype(out_dtype, copy=False) for g in grads)
