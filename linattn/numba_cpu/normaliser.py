"""Normalised linear attention and its backward around any product, for the Numba backend:
Eq. (5)/(9)-(12) forward and the O(N)-memory backward of section 3.3.1, Eq. (13)-(15), of
Katharopoulos et al. (2020), arXiv:2006.16236, with the elu+1 feature map (Eq. 7) of ``elu``.

A *product* is a function ``product(a, b, c, *, reverse, eps, out, den, start)`` writing
out_i = c_i^T sum_{j <= i} a_j b_j^T (j >= i if reverse, all j if not causal) into ``out``,
normalised by c_i^T sum_j a_j + eps (also written to ``den``) when ``eps`` is not None, on
(R, N, W) rows: C-contiguous, batch x heads flattened; ``start`` (rows, or None) is the
state a causal scan starts from (``products.causal_product``); ``loops`` gives the compiled
loops. Key padding and states as in ``padding``.
``attend`` and ``attend_backward`` take (..., N, W) arrays in the compute dtype and make
the rows. NumPy's ``forms.normaliser`` is the oracle.
"""
import numpy as np
from numba import njit

from .._checks import rows

from .elu import features, vjp_
from .padding import drop_padded, start_rows, state_of, zero_padded


def attend(product, phi_q, phi_k, v, eps, elu=False, *, key_mask=None, initial_state=None,
           return_state=False):
    """out_i = phi_q_i^T S_i / (phi_q_i^T z_i + eps): one normalised product,
    (..., Nq, F), (..., Nk, F), (..., Nk, M) -> (..., Nq, M).

    With ``elu``, phi_q and phi_k are the raw q and k, and elu+1 is applied here. Padded keys
    (``key_mask`` False) are dropped first (``padding``); a state (S0, z0) handed over is where
    the causal scan starts, so out_i reads S0 + S_i and z0 + z_i (Eq. 20); with
    ``return_state``, ``(out, State(S0 + S_N, z0 + z_N))``, the sums phi_k^T v and phi_k^T 1
    as two BLAS products.
    """
    phi_k, v = drop_padded(phi_k, v, key_mask, elu)
    q, k, v_rows = rows(phi_q), rows(phi_k), rows(v)
    if elu:
        q, k = features(q), features(k)
    out = np.empty((*q.shape[:-1], v.shape[-1]), dtype=v.dtype)   # (R, Nq, M)
    den = np.empty(q.shape[:-1], dtype=v.dtype)
    s1 = None if initial_state is None else start_rows(initial_state, v.dtype)
    product(k, v_rows, q, reverse=False, eps=eps, out=out, den=den, start=s1)
    out = out.reshape((*phi_q.shape[:-1], v.shape[-1]))
    if not return_state:
        return out
    final = np.empty((k.shape[0], k.shape[-1], v.shape[-1] + 1), dtype=v.dtype)  # (R, F, M+1)
    np.matmul(k.swapaxes(1, 2), v_rows, out=final[..., :-1])     # S_N = phi_k^T v, Eq. (10)
    final[..., -1] = k.sum(axis=1)                                # z_N = phi_k^T 1, Eq. (11)
    if s1 is not None:
        final += s1
    return out, state_of(final, v.shape[:-2])


def attend_backward(product, dout, phi_q, phi_k, v, eps, elu=False, *, key_mask=None,
                    initial_state=None, dstate=None):
    """(dphi_q, dphi_k, dv) by four products, none storing a state per position, then
    State(dS0, dz0) when ``initial_state`` is given.

    With out = num / den, dnum = dout / den and dden = -dout . out / den (one more column of
    dnum1 = [dnum, dden], as v1 = [v, 1] carries the normaliser):
        dphi_q_i = [S0, z0] dnum1_i + sum_{j <= i} (dnum1_i . v1_j) phi_k_j      Eq. (13)
        dphi_k_i = [dS, dz] v1_i + sum_{j >= i} (v1_i . dnum1_j) phi_q_j        Eq. (14)
        dv_i     = dS^T phi_k_i + sum_{j >= i} (phi_k_i . phi_q_j) dnum_j       Eq. (15)
        [dS0, dz0] = sum_i phi_q_i dnum1_i^T + [dS, dz]
    forward in time for dphi_q, backward for the others: the state handed over, [S0, z0],
    and the final state's gradient ``dstate``, [dS, dz], are where those scans start.
    With ``elu``, the inputs are the raw q and k and the gradients are (dq, dk, dv). The
    gradients of padded keys are exactly 0.
    Memory: O(N (F + M)), a few arrays of the inputs' size; O(F M) per worker.
    """
    phi_k, v = drop_padded(phi_k, v, key_mask, elu)
    x_q, x_k, v_rows = rows(phi_q), rows(phi_k), rows(v)
    q, k = (features(x_q), features(x_k)) if elu else (x_q, x_k)
    out = np.empty((*q.shape[:-1], v.shape[-1]), dtype=v.dtype)     # (R, Nq, M)
    den = np.empty(q.shape[:-1], dtype=v.dtype)
    s1 = None if initial_state is None else start_rows(initial_state, v.dtype)
    dfinal = None if dstate is None else start_rows(dstate, v.dtype)  # (R, F, M + 1)
    product(k, v_rows, q, reverse=False, eps=eps, out=out, den=den, start=s1)  # out, den
    dnum1, v1 = _backward_inputs(rows(dout), out, den, v_rows)
    del out
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v_rows)
    product(v1, k, dnum1, reverse=False, eps=None, out=dq, den=den,
            start=_transposed(s1))                                          # Eq. (13)
    product(dnum1, q, v1, reverse=True, eps=None, out=dk, den=den,
            start=_transposed(dfinal))                                      # Eq. (14)
    product(q, dnum1, k, reverse=True, eps=None, out=dv, den=den,
            start=dfinal)                                      # Eq. (15), dnum and dS only
    ds1 = None
    if initial_state is not None:
        ds1 = np.matmul(q.swapaxes(1, 2), dnum1)                    # (R, F, M + 1)
        if dfinal is not None:
            ds1 += dfinal
    if elu:
        dq, dk = vjp_(x_q, dq), vjp_(x_k, dk)
    dk, dv = zero_padded(key_mask, dk.reshape(phi_k.shape), dv.reshape(v.shape))
    grads = (dq.reshape(phi_q.shape), dk, dv)
    return grads if ds1 is None else (*grads, state_of(ds1, v.shape[:-2]))


def _transposed(s1):
    """(R, F, W) -> C-contiguous (R, W, F): a state as the products whose first operand is
    the wide one (v1 or dnum1) hold it; None stays None."""
    return None if s1 is None else np.ascontiguousarray(s1.swapaxes(1, 2))


def _backward_inputs(dout, out, den, v):
    dnum1 = np.empty((*dout.shape[:-1], v.shape[-1] + 1), dtype=v.dtype)   # (R, Nq, M + 1)
    v1 = np.empty((*v.shape[:-1], v.shape[-1] + 1), dtype=v.dtype)         # (R, Nk, M + 1)
    _fill_backward_inputs(dout, out, den, v, dnum1, v1)
    return dnum1, v1


@njit(cache=True, error_model="numpy")
def _fill_backward_inputs(dout, out, den, v, dnum1, v1):
    """dnum1 = [dout / den, -dout . out / den] (R, Nq, M + 1) and v1 = [v, 1] (R, Nk, M + 1).

    Serial, like every pass here but the products: it is memory-bound, and idle Numba
    threads would spin beside the BLAS threads of the matrix-product form.
    """
    rows, n_q, m = dout.shape
    for r, i in np.ndindex(rows, n_q):
        d = den[r, i]
        dot = v.dtype.type(0)
        for j in range(m):
            dnum1[r, i, j] = dout[r, i, j] / d
            dot += dout[r, i, j] * out[r, i, j]
        dnum1[r, i, m] = -dot / d                  # the normaliser's gradient
    one = v.dtype.type(1)
    for r, i in np.ndindex(rows, v.shape[1]):
        for j in range(m):
            v1[r, i, j] = v[r, i, j]
        v1[r, i, m] = one
