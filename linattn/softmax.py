"""Softmax attention, the O(N^2) baseline, public functions: Eq. (2) of Katharopoulos et al.
(2020), "Transformers are RNNs", arXiv:2006.16236, with its causal mask, Eq. (8), and
sim(q, k) = exp(q.k / sqrt(D)).

Each function checks its inputs once (``_checks``) and runs the kernel ``dispatch`` picks:
``forms.softmax`` (NumPy, the N x N oracle), ``numba_cpu.softmax`` (tiles, never the N x N
matrix) or ``cuda.softmax``.
"""
from . import _checks, dispatch


def softmax_attention(q, k, v, *, causal=False, scale=None, backend="auto",
                      key_mask=None, key_lengths=None, return_lse=False):
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
    return_lse : bool
        Also return the log-sum-exp of each query's logits, which
        ``softmax_attention_backward`` can take with ``out`` to skip recomputing the forward.
        Runs on the NumPy form and the Numba tiles (on CuPy arrays, through NumPy's form).

    Returns
    -------
    out : ndarray, shape (..., Nq, M), in the inputs' dtype (float16 is computed in float32).
    lse : ndarray, shape (..., Nq), only with ``return_lse``
        lse_i = log sum_j exp(scale q_i . k_j) over the keys query i sees (causal: j <= i;
        real keys only), -inf for a query whose keys are all padded; in the dtype the kernel
        computed in (float32 for float16 inputs).

    Cost: O(Nq Nk max(D, M)) time; O(Nq Nk) memory on NumPy and CuPy, O(Nq + Nk) per row on
    Numba.
    """
    (q, k, v), out_dtype = _checks.check_qkv(q, k, v, causal=causal)
    return_lse = _checks.check_flag("return_lse", return_lse)
    kernel, kw = _kernel(q, k, causal, scale, backend, key_mask, key_lengths,
                         lse=return_lse)
    if return_lse:
        out, lse = kernel.attend(q, k, v, return_lse=True, **kw)
        return out.astype(out_dtype, copy=False), lse
    return kernel.attend(q, k, v, **kw).astype(out_dtype, copy=False)


def softmax_attention_backward(dout, q, k, v, *, causal=False, scale=None, backend="auto",
                               key_mask=None, key_lengths=None, out=None, lse=None):
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
    out, lse : ndarray, shapes (..., Nq, M) and (..., Nq), optional, both or neither
        What ``softmax_attention(..., return_lse=True)`` returned for these inputs. The
        backward then takes P = exp(scale q k^T - lse) and rowsum(dP * P) = rowsum(dout *
        out) from them instead of recomputing the forward: the Numba tiles skip their
        forward pass. Other values give other (wrong) gradients; they are not checked
        against q, k, v.

    Returns
    -------
    dq : ndarray, shape (..., Nq, D)
    dk : ndarray, shape (..., Nk, D)
    dv : ndarray, shape (..., Nk, M)

    Cost: as the forward; P is recomputed, never stored.
    """
    (q, k, v, dout), out_dtype = _checks.check_qkv(q, k, v, dout, causal=causal)
    saved = _check_saved(out, lse, dout, q.dtype)
    kernel, kw = _kernel(q, k, causal, scale, backend, key_mask, key_lengths,
                         lse=saved is not None)
    if saved is not None:
        kw.update(out=saved[0], lse=saved[1])
    grads = kernel.attend_backward(dout, q, k, v, **kw)
    return tuple(g.astype(out_dtype, copy=False) for g in grads)


def _check_saved(out, lse, dout, dtype):
    """(out, lse) in ``dtype``, checked against dout's shape (..., Nq, M) and the module of
    the arrays; None when neither is given; TypeError / ValueError otherwise."""
    if out is None and lse is None:
        return None
    if out is None or lse is None:
        raise ValueError("out and lse go together: give both (softmax_attention(..., "
                         "return_lse=True) returns them) or neither")
    out, lse = _checks.as_float_array("out", out), _checks.as_float_array("lse", lse)
    xp = _checks.array_module(dout)
    if _checks.array_module(out) is not xp or _checks.array_module(lse) is not xp:
        raise TypeError(f"out and lse must be {xp.__name__} arrays like q, k and v")
    if out.shape != dout.shape or lse.shape != dout.shape[:-1]:
        raise ValueError(f"out and lse must have shapes (..., Nq, M) {dout.shape} and "
                         f"(..., Nq) {dout.shape[:-1]}, as softmax_attention returned "
                         f"them; got out{out.shape}, lse{lse.shape}")
    return out.astype(dtype, copy=False), lse.astype(dtype, copy=False)


def _kernel(q, k, causal, scale, backend, key_mask, key_lengths, lse=False):
    """The rest of the checks both directions share, once: (the backend module, its keyword
    options: causal, scale, and the key mask only when one is given); ``lse``: the call
    takes or returns the log-sum-exp."""
    _checks.check_keys(q, k)
    xp = _checks.array_module(q)
    scale = _checks.check_scale(scale, q.shape[-1])
    mask = _checks.check_key_mask(key_mask, key_lengths, q.shape[:-2], k.shape[-2], xp)
    kernel, _ = dispatch.kernel("softmax", "auto", backend, xp,
                                needs=dispatch.needed(causal=causal, key_mask=mask, lse=lse))
    return kernel, dict(causal=causal, scale=scale, **dispatch.given(key_mask=mask))
