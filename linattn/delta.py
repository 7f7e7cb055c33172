"""The delta rule, the public functions: a fast-weight memory that overwrites what it stores
under a key instead of adding to it (Schlag, Irie and Schmidhuber 2021, "Linear Transformers
Are Secretly Fast Weight Programmers", arXiv:2102.11174; DeltaNet, Yang et al.
2024, "Parallelizing Linear Transformers with the Delta Rule over Sequence Length",
arXiv:2406.06484).

Linear attention (arXiv:2006.16236, Eq. 18) adds phi(k_t) v_t^T to its memory at every
position, so a key written twice returns the sum of its values. The delta rule first reads
what the memory holds for the key and writes only the difference, with a strength beta_t:

    k~_t = phi(k_t) / ||phi(k_t)||,  q~_t = phi(q_t) / ||phi(q_t)||     (unit features)
    S_t = S_{t-1} + beta_t k~_t (v_t - S_{t-1}^T k~_t)^T
        = (I - beta_t k~_t k~_t^T) S_{t-1} + beta_t k~_t v_t^T
    out_t = S_t^T q~_t

This is one step of gradient descent with step size beta_t on 0.5 ||S^T k~_t - v_t||^2, the
error of the memory's answer for k~_t (its gradient with respect to S is
-k~_t (v_t - S^T k~_t)^T). With beta_t = 1 the memory answers exactly v_t for k~_t afterwards.

Each function checks its inputs once (``_checks``), applies the feature map and the
normalisation (their backward passes by hand: ``_unit_vjp`` and the map's ``vjp``), and hands
the unit features to the form ``dispatch`` picks. Oracle: ``method="recurrent"``, the scan of
the step (``forms.delta``); the WY form is ``forms.delta_chunked``.
"""
import numpy as np

from . import _checks, dispatch
from .feature_maps import get_feature_map


def _unit(x):
    """x / ||x|| along the last axis; a zero vector stays zero (it then writes nothing)."""
    norm = np.sqrt((x * x).sum(axis=-1, keepdims=True))
    return x / np.where(norm > 0, norm, 1)


def _unit_vjp(x, dy):
    """Backward of ``_unit``: dx = (dy - y (y . dy)) / ||x||, y = x / ||x|| (the projection
    of dy off the direction y, scaled); dx = dy at a zero vector, where ``_unit`` is x."""
    norm = np.sqrt((x * x).sum(axis=-1, keepdims=True))
    safe = np.where(norm > 0, norm, 1)
    y = x / safe
    return (dy - y * (y * dy).sum(axis=-1, keepdims=True)) / safe


class _Features:
    """The feature map phi (None: the identity, F = D) followed, if ``unit``, by the L2
    normalisation: x -> phi(x) / ||phi(x)||, forward and vector-Jacobian product."""

    def __init__(self, feature_map, unit, name):
        self.phi = None if feature_map is None else get_feature_map(feature_map)
        self.unit = _checks.check_flag(name, unit)

    def forward(self, x):
        p = x if self.phi is None else self.phi.forward(x)
        return _unit(p) if self.unit else p

    def vjp(self, x, dy):
        p = x if self.phi is None else self.phi.forward(x)
        dp = _unit_vjp(p, dy) if self.unit else dy
        return dp if self.phi is None else self.phi.vjp(x, dp)


def _prepare(q, k, v, beta, dout, feature_map, normalize_keys, normalize_queries, method,
             backend, chunk_size, initial_state, return_state):
    """Checked inputs, the features, the kernel and its keywords, for forward and backward."""
    arrays, out_dtype = _checks.check_qkv(q, k, v, *(() if dout is None else (dout,)),
                                          causal=True)
    _checks.check_numpy_only("the delta rule", *arrays)
    q, k, v = arrays[:3]
    beta = _checks.check_beta(beta, q.shape[:-1], q.dtype)
    fq = _Features(feature_map, normalize_queries, "normalize_queries")
    fk = _Features(feature_map, normalize_keys, "normalize_keys")
    x_q, x_k = fq.forward(q), fk.forward(k)
    state = _checks.check_memory(initial_state, (*q.shape[:-2], x_k.shape[-1], v.shape[-1]),
                                 q.dtype)
    needs = dispatch.needed(causal=True, initial_state=state, return_state=return_state)
    kernel, _ = dispatch.kernel("delta", method, backend, np, True, q.shape[-2:], needs=needs)
    kw = dispatch.given(initial_state=state)
    if _checks.check_chunk_size(chunk_size) is not None:
        kw["chunk_size"] = chunk_size
    return (q, k, v, beta, arrays[3:]), out_dtype, (fq, fk, x_q, x_k), kernel, kw


def delta_rule_attention(q, k, v, beta, *, feature_map="elu+1", normalize_keys=True,
                         normalize_queries=True, method="auto", backend="auto",
                         chunk_size=None, initial_state=None, return_state=False):
    """Causal attention by the delta rule (Schlag et al. 2021; Yang et al. 2024).

    S_t = S_{t-1} + beta_t k~_t (v_t - S_{t-1}^T k~_t)^T from S_0 (zero, or
    ``initial_state``), out_t = S_t^T q~_t, with k~_t = phi(k_t) / ||phi(k_t)|| and
    q~_t = phi(q_t) / ||phi(q_t)|| (see the module docstring for the derivation). There is no
    normaliser phi(q)^T z as in linear attention: S_t^T k~ is a regression estimate of the
    value stored under k~, already on the values' scale, and with unit keys and beta in
    [0, 2] the memory cannot grow without bound (each update is a contraction along k~_t
    plus the new value), so there is nothing to divide by.

    Parameters
    ----------
    q, k : ndarray, shape (..., N, D)
    v : ndarray, shape (..., N, M)
    beta : ndarray, shape (..., N)
        The write strength of each position, in [0, 2] where finite (a model computes it as
        the sigmoid of a projection of the input, so in (0, 1)); beta_t = 1 replaces the
        value stored under k~_t by v_t, beta_t = 0 writes nothing. Outside [0, 2] the update
        amplifies the memory along k~_t: a ValueError. A NaN gives NaN at its position and
        after ("chunked": from the first position of its chunk).
    feature_map : {"elu+1", "relu", "taylor", "favor"}, object or None
        phi (``feature_maps``); None is the identity (F = D), DeltaNet's choice before its
        normalisation.
    normalize_keys, normalize_queries : bool
        Divide phi(k_t), phi(q_t) by their L2 norms (both True, as DeltaNet does). Without
        unit keys the update is a contraction only while beta_t ||phi(k_t)||^2 <= 2, which
        the caller then answers for. A zero feature vector stays zero.
    method : {"auto", "recurrent", "chunked"}
        "recurrent" scans the step (the oracle); "chunked" solves blocks of ``chunk_size``
        positions by the WY representation. "auto" is "chunked".
    backend : {"auto", "numpy", "numba"}
        "numba" runs both methods compiled: "recurrent" as loops (``numba_cpu.delta``, held
        to NumPy's scan), "chunked" as loops around BLAS products
        (``numba_cpu.delta_chunked``, held to NumPy's WY form). "auto" is "numba" when
        numba imports, else "numpy". "cupy" and CuPy arrays are an error: the family has no
        CUDA kernel.
    chunk_size : int or None
        Block length of "chunked" (default 32); for "recurrent", the positions between the
        states its backward stores (default about sqrt(N)).
    initial_state : ndarray, shape (..., F, M), optional
        S_0, the memory after earlier positions, e.g. one ``return_state`` gave.
    return_state : bool
        Also return S_N, the memory after the last position.

    Returns
    -------
    out : ndarray, shape (..., N, M), in the inputs' dtype (float16 is computed in float32).
    S : ndarray, shape (..., F, M)
        Only with ``return_state``, in the compute dtype.

    Cost: O(N F M) time for both methods ("chunked" adds O(N C (F + M))); memory O(F M)
    beyond the inputs and outputs for "recurrent", O(N (C + F + M) + F M) for "chunked".
    """
    return_state = _checks.check_flag("return_state", return_state)
    (q, k, v, beta, _), out_dtype, (_, _, x_q, x_k), kernel, kw = _prepare(
        q, k, v, beta, None, feature_map, normalize_keys, normalize_queries, method, backend,
        chunk_size, initial_state, return_state)
    out = kernel.attend(x_q, x_k, v, beta, return_state=return_state, **kw)
    if return_state:
        return out[0].astype(out_dtype, copy=False), out[1]
    return out.astype(out_dtype, copy=False)


def delta_rule_attention_backward(dout, q, k, v, beta, *, feature_map="elu+1",
                                  normalize_keys=True, normalize_queries=True, method="auto",
                                  backend="auto", chunk_size=None, initial_state=None,
                                  dstate=None):
    """Gradients of ``delta_rule_attention`` with respect to q, k, v, beta, and S_0 when
    ``initial_state`` is given.

    The form returns the gradients with respect to the unit features, v and beta (backward
    through time, ``forms.delta.attend_backward``; through the WY form,
    ``forms.delta_chunked.attend_backward``; the Numba kernels compute the same); the
    normalisation's and the feature map's vector-Jacobian products carry them back to q and
    k. Pieces of one sequence, processed in order forward and in reverse order backward,
    each handing its dS_0 to the previous piece as ``dstate``, give the gradients of one pass.

    Parameters
    ----------
    dout : ndarray, shape (..., N, M)
    q, k, v, beta and keywords
        As given to ``delta_rule_attention`` (``return_state`` aside).
    dstate : ndarray, shape (..., F, M), optional
        The gradient of the loss with respect to S_N; None when the loss does not use it.

    Returns
    -------
    dq : ndarray, shape (..., N, D)
    dk : ndarray, shape (..., N, D)
    dv : ndarray, shape (..., N, M)
    dbeta : ndarray, shape (..., N)
    dS0 : ndarray, shape (..., F, M)
        Only when ``initial_state`` is given, in the compute dtype.

    Cost: as the forward, about three times its time ("recurrent": memory
    O((N / C + C) F M) for the stored and replayed states, C about sqrt(N); "chunked":
    O((N / C) F M) for the memory entering each chunk).
    """
    (q, k, v, beta, (dout,)), out_dtype, (fq, fk, x_q, x_k), kernel, kw = _prepare(
        q, k, v, beta, dout, feature_map, normalize_keys, normalize_queries, method, backend,
        chunk_size, initial_state, dstate is not None)
    if dstate is not None:
        kw["dstate"] = _checks.check_memory(dstate, (*q.shape[:-2], x_k.shape[-1],
                                                     v.shape[-1]), q.dtype, name="dstate")
    grads = kernel.attend_backward(dout, x_q, x_k, v, beta, **kw)
    dq, dk = fq.vjp(q, grads[0]), fk.vjp(k, grads[1])          # back through phi and ||.||
    dq, dk, dv, dbeta = (g.astype(out_dtype, copy=False) for g in (dq, dk, *grads[2:4]))
    return (dq, dk, dv, dbeta, *grads[4:])


def delta_rule_step(q_t, k_t, v_t, beta_t, state=None, *, feature_map="elu+1",
                    normalize_keys=True, normalize_queries=True, backend="auto"):
    """One position of the delta rule: S_t = S_{t-1} + beta_t k~_t (v_t - S_{t-1}^T k~_t)^T,
    out_t = S_t^T q~_t. Scanning it over positions 1..N gives ``delta_rule_attention``.

    Parameters
    ----------
    q_t, k_t : ndarray, shape (..., D)
    v_t : ndarray, shape (..., M)
    beta_t : ndarray, shape (...)
        One position of every sequence, and its write strength, in [0, 2].
    state : ndarray, shape (..., F, M), or None
        S_{t-1}; None starts from zero.
    feature_map, normalize_keys, normalize_queries
        As for ``delta_rule_attention``.
    backend : {"auto", "numpy", "numba"}
        "auto" is "numba" when numba imports (one compiled call), else "numpy".

    Returns
    -------
    out_t : ndarray, shape (..., M), in the inputs' dtype.
    S_t : ndarray, shape (..., F, M), in the compute dtype; ``state`` is not modified.

    Cost: O(F M) time and memory per step.
    """
    (q_t, k_t, v_t), out_dtype = _checks.check_step(q_t, k_t, v_t)
    _checks.check_numpy_only("the delta rule", q_t, k_t, v_t)
    beta_t = _checks.check_beta(beta_t, q_t.shape[:-1], q_t.dtype, name="beta_t")
    x_q = _Features(feature_map, normalize_queries, "normalize_queries").forward(q_t)
    x_k = _Features(feature_map, normalize_keys, "normalize_keys").forward(k_t)
    shape = (*q_t.shape[:-1], x_k.shape[-1], v_t.shape[-1])
    S = _checks.check_memory(state, shape, q_t.dtype, name="state")
    S = np.zeros(shape, dtype=q_t.dtype) if S is None else S
    kernel, _ = dispatch.kernel("delta", "recurrent", backend, np)
    out, S = kernel.step(x_q, x_k, v_t, beta_t, S)
    return out.astype(out_dtype, copy=False), S
