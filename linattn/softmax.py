"""Softmax attention, the O(N^2) baseline, public functions: Eq. (2) of Katharopoulos et al.
(2020), "Transformers are RNNs", arXiv:2006.16236, with its causal mask, Eq. (8), and
sim(q, k) = exp(q.k / sqrt(D)).

Each function checks its inputs once (``_checks``) and runs the kernel ``dispatch`` picks:
``forms.softmax`` (NumPy, the N x N oracle), ``numba_cpu.softmax`` (tiles, never the N x N
matrix) or ``cuda.softmax``.
"""
from . import _checks, dispatch


def softmax_attention(q, k, v, *, causal=False, scale=None, backend="auto",
                      key_mask=None, key_lengths=None):
    """Softmax attention, the O(N^2) baseline, Eq. (2).

    out = softmax(scale * q k^T) v row by row, scale = 1/sqrt(D) by default;
    if causal, row i sees only j <= i (Eq. 8). Without a mask, queries and keys may have
    different lengths (cross-attention; Nq = 1 against a key/value cache is a generation step).

    Parameters
    ----------
    q : ndarray, shape (..., Nq, D)
    k : ndarray, shape (..., Nk, D)
    v : ndarray, shape (..., Nk, M)
        Leading axes (batch, heads, ...) must be equal, and may be absent. Causal: Nq == Nk.
    causal : bool
    scale : float, optional
    backend : {"auto", "numpy", "numba", "cupy"}
        "cupy" (and "auto" with CuPy arrays) runs ``linattn.cuda.softmax``; "numba" (and
        "auto" when numba imports) never builds the Nq x Nk matrix; "numpy" builds it.
    key_mask : ndarray of bool, shape broadcasting to (..., Nk), optional
        True for a real key. A padded key gets probability 0 in every row, whatever it
        holds; a query whose keys are all padded gets 0 (not NaN), and its gradients are 0.
        Runs on the NumPy form and the Numba tiles (on CuPy arrays, through NumPy's form).
    key_lengths : ndarray of int, shape broadcasting to the leading axes, optional
        The number of real keys of each sequence, padded on the right; instead of key_mask.

    Returns
    -------
    out : ndarray, shape (..., Nq, M), in the inputs' dtype (float16 is computed in float32).

    Cost: O(Nq Nk max(D, M)) time; O(Nq Nk) memory on NumPy and CuPy, O(Nq + Nk) per row on
    Numba.
    """
    (q, k, v), out_dtype = _checks.check_qkv(q, k, v, causal=causal)
    kernel, kw = _kernel(q, k, causal, scale, backend, key_mask, key_lengths)
    out = kernel.attend(q, k, v, **kw)
    return out.astype(out_dtype, copy=False)


def softmax_attention_backward(dout, q, k, v, *, causal=False, scale=None, backend="auto",
                               key_mask=None, key_lengths=None):
    """Gradients of softmax attention: the backward of Eq. (2).

    With P = softmax(L), L = scale * q k^T and out = P v:
    dv = P^T dout, dP = dout v^T, dL = P * (dP - rowsum(dP * P)),
    dq = scale * dL k, dk = scale * dL^T q.

    Parameters
    ----------
    dout : ndarray, shape (..., Nq, M)
        Gradient of the loss with respect to ``out``.
    q, k, v, causal, scale, backend, key_mask, key_lengths
        As given to ``softmax_attention``. dk and dv are exactly 0 at padded keys.

    Returns
    -------
    dq : ndarray, shape (..., Nq, D)
    dk : ndarray, shape (..., Nk, D)
    dv : ndarray, shape (..., Nk, M)

    Cost: as the forward; P is recomputed, never stored.
    """
    (q, k, v, dout), out_dtype = _checks.check_qkv(q, k, v, dout, causal=causal)
    kernel, kw = _kernel(q, k, causal, scale, backend, key_mask, key_lengths)
    grads = kernel.attend_backward(dout, q, k, v, **kw)
    return tuple(g.astype(out_dtype, copy=False) for g in grads)


def _kernel(q, k, causal, scale, backend, key_mask, key_lengths):
    """The rest of the checks both directions share, once: (the backend module, its keyword
    options: causal, scale, and the key mask only when one is given)."""
    _checks.check_keys(q, k)
    xp = _checks.array_module(q)
    scale = _checks.check_scale(scale, q.shape[-1])
    mask = _checks.check_key_mask(key_mask, key_lengths, q.shape[:-2], k.shape[-2], xp)
    kernel, _ = dispatch.kernel("softmax", "auto", backend, xp,
                                needs=dispatch.needed(causal=causal, key_mask=mask))
    return kernel, dict(causal=causal, scale=scale, **dispatch.given(key_mask=mask))
