"""The delta rule as a recurrence: ``method="recurrent"`` of ``linattn.delta_rule_attention``.

The fast-weight memory S (F, M) of Schlag, Irie and Schmidhuber (2021), "Linear Transformers
Are Secretly Fast Weight Programmers", arXiv:2102.11174, as DeltaNet writes it
(Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule over Sequence
Length", arXiv:2406.06484). With unit keys k_t (F), queries q_t (F), values v_t (M)
and write strengths beta_t:

    u_t = v_t - S_{t-1}^T k_t                  what the memory gets wrong about v_t
    S_t = S_{t-1} + beta_t k_t u_t^T           = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
    out_t = S_t^T q_t

The update is one step of gradient descent, step size beta_t, on the regression loss
L(S) = 0.5 ||S^T k_t - v_t||^2, whose gradient is k_t (S^T k_t - v_t)^T = -k_t u_t^T: the
memory moves its answer for k_t towards v_t, and with beta_t = 1 and ||k_t|| = 1 it answers
exactly v_t afterwards (it overwrites, where linear attention's S + k v^T accumulates).

``step`` is one position, ``attend`` scans it: the oracle of every other form of the family
(``delta_chunked``), and of compiled kernels. Inputs here are already feature-mapped and
normalised by ``linattn.delta``.
"""
import math

import numpy as np

FUSED_FEATURE_MAPS = ()                     # features are computed before the kernel
SUPPORTS = frozenset({"initial_state", "return_state"})  # dispatch; always causal


def step(q, k, v, beta, S):
    """One position of the delta rule: (out (..., M), S_t (..., F, M)).

    q, k (..., F); v (..., M); beta (...); S (..., F, M) the memory S_{t-1}, not modified.
    Cost O(F M).
    """
    u = v - (k[..., None, :] @ S)[..., 0, :]                  # u_t = v_t - S^T k_t   (..., M)
    S = S + beta[..., None, None] * k[..., :, None] * u[..., None, :]  # S_t, (..., F, M)
    return (q[..., None, :] @ S)[..., 0, :], S                # out_t = S_t^T q_t


def _zero(q, v):
    return np.zeros((*v.shape[:-2], q.shape[-1], v.shape[-1]), dtype=v.dtype)


def attend(q, k, v, beta, *, chunk_size=None, initial_state=None, return_state=False):
    """Scan ``step`` over the positions: out (..., N, M), and S_N (..., F, M) with
    ``return_state``.

    q, k (..., N, F) (k of unit length), v (..., N, M), beta (..., N); ``initial_state`` S_0
    (..., F, M), zero when None. ``chunk_size`` is ignored. Cost O(N F M) time, O(F M) memory
    beyond the output.
    """
    S = _zero(q, v) if initial_state is None else initial_state
    out = np.empty((*q.shape[:-1], v.shape[-1]), dtype=v.dtype)
    for i in range(q.shape[-2]):
        out[..., i, :], S = step(q[..., i, :], k[..., i, :], v[..., i, :], beta[..., i], S)
    return (out, S) if return_state else out


def default_segment(n):
    """Positions between stored states in the backward: about sqrt(N), which balances the
    N / C stored states against the C recomputed ones."""
    return max(1, math.isqrt(max(n, 1)))


def attend_backward(dout, q, k, v, beta, *, chunk_size=None, initial_state=None, dstate=None):
    """Backpropagation through time: (dq, dk, dv, dbeta), and dS_0 when ``initial_state`` is
    given.

    Backward through one step, with G = dL/dS_t (the adjoint, starting from ``dstate`` or 0)
    and S = S_{t-1}:

        dq_t = S_t dout_t,               G <- G + q_t dout_t^T     (out_t = S_t^T q_t)
        dbeta_t = k_t^T G u_t,           du_t = beta_t G^T k_t     (S_t = S + beta_t k_t u_t^T)
        dk_t = beta_t G u_t - S du_t,    dv_t = du_t               (u_t = v_t - S^T k_t)
        G <- G - k_t du_t^T                                        (dL/dS_{t-1})

    Each step needs S_{t-1}. Undoing the update (S_{t-1} from S_t) divides by 1 - beta_t,
    which is 0 at beta_t = 1 and loses digits near it, so states are recomputed instead: the
    forward pass stores S every ``chunk_size`` positions (default about sqrt(N)), and each
    segment is replayed from its stored state before it is walked backward.

    Cost: O(N F M) time (two forward scans and one backward); memory O((N / C + C) F M) for
    C = ``chunk_size``: the stored states and one segment's states.
    """
    n = q.shape[-2]
    c = default_segment(n) if chunk_size is None else chunk_size
    S = _zero(q, v) if initial_state is None else initial_state
    starts = list(range(0, n, c))
    stored = []                                         # S before each segment, (..., F, M)
    for a in starts:                                    # forward: states at segment starts
        stored.append(S)
        for i in range(a, min(a + c, n)):
            _, S = step(q[..., i, :], k[..., i, :], v[..., i, :], beta[..., i], S)
    G = np.zeros_like(S) if dstate is None else dstate.astype(S.dtype, copy=True)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    dbeta = np.empty_like(beta)
    for a, S in zip(reversed(starts), reversed(stored)):
        states = [S]                                    # replay: S_{a-1}, ..., S_{b-1}
        for i in range(a, min(a + c, n)):
            states.append(step(q[..., i, :], k[..., i, :], v[..., i, :], beta[..., i],
                               states[-1])[1])
        for i in reversed(range(a, min(a + c, n))):
            S_prev, S_t = states[i - a], states[i - a + 1]
            q_t, k_t, v_t, b_t = q[..., i, :], k[..., i, :], v[..., i, :], beta[..., i]
            dout_t = dout[..., i, :]
            dq[..., i, :] = (S_t @ dout_t[..., :, None])[..., 0]        # S_t dout_t
            G = G + q_t[..., :, None] * dout_t[..., None, :]            # + q_t dout_t^T
            u = v_t - (k_t[..., None, :] @ S_prev)[..., 0, :]           # u_t, (..., M)
            Gu = (G @ u[..., :, None])[..., 0]                          # G u_t, (..., F)
            dbeta[..., i] = (k_t * Gu).sum(axis=-1)                     # k_t^T G u_t
            du = b_t[..., None] * (k_t[..., None, :] @ G)[..., 0, :]    # beta_t G^T k_t
            dk[..., i, :] = b_t[..., None] * Gu - (S_prev @ du[..., :, None])[..., 0]
            dv[..., i, :] = du
            G = G - k_t[..., :, None] * du[..., None, :]                # dL/dS_{t-1}
    grads = (dq, dk, dv, dbeta)
    return grads if initial_state is None else (*grads, G)
