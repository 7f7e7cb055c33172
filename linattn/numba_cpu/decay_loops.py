"""``method="linear"`` (and ``"recurrent"``) on the Numba backend with a decay, a log gate or
without the normaliser: the gated running sums of ``forms.decay_recurrent`` as compiled
loops over positions,

    S_i = diag(alpha_i) S_{i-1} + phi(k_i) v_i^T,   num_i = phi(q_i)^T S_i,

with the adjoint scanned backward for the gradients (RetNet, Sun et al. 2023; GLA, Yang et
al. 2023; see ``forms.decay``). The normaliser, the key mask, the states and the log gate's
gradient are ``forms.decay``'s NumPy wrapper around these two loops. One sequence (row) at a
time, serial: plain loops. Oracle: ``forms.decay_recurrent`` (and ``forms.decay``).
"""
import numba
import numpy as np

from ..forms.decay import gated, gated_backward

FUSED_FEATURE_MAPS = ()  # every feature map is applied before the kernel
SUPPORTS = frozenset({"non_causal", "key_mask", "initial_state", "return_state", "decay",
                      "log_gate", "unnormalized"})  # dispatch; gates causal only


@numba.njit(cache=True)
def _scan(q, k, v, alpha, s, num, zero):
    """num[r, i] = q[r, i]^T S_i, S_i = diag(alpha[r, i]) S_{i-1} + k[r, i] v[r, i]^T, with
    S in ``s`` (R, F, W), updated in place from S0 to S_N. q, k, alpha (R, N, F), v (R, N, W);
    ``zero`` of their dtype, so that float32 sums stay float32."""
    rows, n, f_width = q.shape
    w_width = v.shape[2]
    for r in range(rows):
        for i in range(n):
            for f in range(f_width):
                a, kf = alpha[r, i, f], k[r, i, f]
                for w in range(w_width):
                    s[r, f, w] = a * s[r, f, w] + kf * v[r, i, w]     # S_i
            for w in range(w_width):
                acc = zero
                for f in range(f_width):
                    acc += q[r, i, f] * s[r, f, w]                    # phi_q_i^T S_i
                num[r, i, w] = acc


@numba.njit(cache=True)
def _scan_backward(dnum, q, k, v, alpha, s, adj, dq, dk, dv, zero):
    """Forward from S0 (``s``): dq_i = S_i dnum_i. Backward from dS_N (``adj``), the adjoint
    G_i = q_i dnum_i^T + diag(alpha_{i+1}) G_{i+1}: dk_i = G_i v_i, dv_i = G_i^T k_i; ``adj``
    ends as dS0 = diag(alpha_1) G_1. Shapes as ``_scan``; s and adj (R, F, W) in place."""
    rows, n, f_width = q.shape
    w_width = v.shape[2]
    for r in range(rows):
        for i in range(n):                                            # forward in time
            for f in range(f_width):
                a, kf = alpha[r, i, f], k[r, i, f]
                acc = zero
                for w in range(w_width):
                    s[r, f, w] = a * s[r, f, w] + kf * v[r, i, w]
                    acc += s[r, f, w] * dnum[r, i, w]
                dq[r, i, f] = acc
        for i in range(n - 1, -1, -1):                                # backward in time
            for w in range(w_width):
                dv[r, i, w] = zero
            for f in range(f_width):
                qf, kf, acc = q[r, i, f], k[r, i, f], zero
                for w in range(w_width):
                    adj[r, f, w] += qf * dnum[r, i, w]                # G_i
                    acc += adj[r, f, w] * v[r, i, w]
                    dv[r, i, w] += kf * adj[r, f, w]
                dk[r, i, f] = acc
                for w in range(w_width):
                    adj[r, f, w] *= alpha[r, i, f]                    # dL/dS_{i-1}


def _rows(x):
    """(..., A, B) -> a C-contiguous (R, A, B) array, R the product of the leading axes."""
    rows = int(np.prod(x.shape[:-2], dtype=np.int64))
    return np.ascontiguousarray(x.reshape(rows, *x.shape[-2:]))


def _state(s, phi_k, v):
    """The state (R, F, W) to update in place: a copy of ``s`` (..., F, W), or zeros."""
    shape = (int(np.prod(v.shape[:-2], dtype=np.int64)), phi_k.shape[-1], v.shape[-1])
    return np.zeros(shape, dtype=v.dtype) if s is None else _rows(s).copy()


def product(phi_q, phi_k, v, g, s0=None, chunk_size=None):
    """``forms.decay_recurrent.product`` compiled: (num (..., N, W), S_N (..., F, W))."""
    q, k, vr, alpha = (_rows(x) for x in (phi_q, phi_k, v, np.exp(g)))
    s = _state(s0, phi_k, v)
    num = np.empty(vr.shape, dtype=v.dtype)
    _scan(q, k, vr, alpha, s, num, v.dtype.type(0))
    return num.reshape(v.shape), s.reshape(*v.shape[:-2], *s.shape[1:])


def product_backward(dnum, phi_q, phi_k, v, g, s0=None, dfinal=None, chunk_size=None):
    """``forms.decay_recurrent.product_backward`` compiled: (dphi_q, dphi_k, dv, dS0 or
    None)."""
    q, k, vr, alpha, do = (_rows(x) for x in (phi_q, phi_k, v, np.exp(g), dnum))
    s, adj = _state(s0, phi_k, v), _state(dfinal, phi_k, v)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(vr)
    _scan_backward(do, q, k, vr, alpha, s, adj, dq, dk, dv, v.dtype.type(0))
    ds0 = None if s0 is None else adj.reshape(s0.shape)
    return dq.reshape(phi_q.shape), dk.reshape(phi_k.shape), dv.reshape(v.shape), ds0


def attend(phi_q, phi_k, v, *, causal, eps, chunk_size=None, log_gate=None, normalize=True,
           key_mask=None, initial_state=None, return_state=False):
    """``forms.decay_recurrent.attend`` with the compiled loops. Cost: O(N F M) time."""
    return gated(product, phi_q, phi_k, v, eps=eps, log_gate=log_gate, normalize=normalize,
                 key_mask=key_mask, initial_state=initial_state, return_state=return_state,
                 causal=causal)


def attend_backward(dout, phi_q, phi_k, v, *, causal, eps, chunk_size=None, log_gate=None,
                    normalize=True, key_mask=None, initial_state=None, dstate=None):
    """Backward of ``attend``: (dphi_q, dphi_k, dv, dlog_gate), and State(dS0, dz0) when
    ``initial_state`` is given."""
    return gated_backward(product, product_backward, dout, phi_q, phi_k, v, eps=eps,
                          log_gate=log_gate, normalize=normalize, key_mask=key_mask,
                          initial_state=initial_state, dstate=dstate, causal=causal)
