"""Decayed and gated causal linear attention: the recurrence of Katharopoulos et al. (2020),
arXiv:2006.16236, Eq. (18)-(20), with the state multiplied by a gate before each update,

    S_i = diag(alpha_i) S_{i-1} + phi(k_i) v_i^T,   z_i = alpha_i * z_{i-1} + phi(k_i),
    out_i = phi(q_i)^T S_i / (phi(q_i)^T z_i + eps)     (or phi(q_i)^T S_i, unnormalised),

with alpha_i = exp(g_i) in (0, 1]^F. A scalar alpha = gamma per head is the decay of RetNet
(Sun et al. 2023, "Retentive Network", Eq. 1-4, which also drops the normaliser) and the
scalar state transition of Mamba-2 (Dao and Gu 2024, "Transformers are SSMs", section 5);
alpha_i per position and feature, given as the log gate g_i <= 0, is the gate of GLA (Yang et
al. 2023, "Gated Linear Attention Transformers with Hardware-Efficient Training", Eq. 3).

Unrolled, with b_i = g_1 + ... + g_i (cumulative log gates, (..., N, F)):

    S_i = diag(exp(b_i)) S0 + sum_{j <= i} diag(exp(b_i - b_j)) phi(k_j) v_j^T,

so the kernel matrix of Eq. (8) becomes A_ij = sum_f phi(q_i)_f phi(k_j)_f exp(b_if - b_jf),
j <= i. Every form here computes exp(b_i - b_j) only for j <= i (masked *before* the exp), so
every exponent is <= 0 and nothing overflows, whatever N and however strong the decay.

As in ``normaliser``, the normaliser is one more value column of ones: z decays as S's rows
do, so a form only computes the gated product num_i = phi(q_i)^T S_i of [v, 1] (or of v
alone when unnormalised) and its backward. The gradient of the log gates comes from the
product's own gradients (GLA, section 4.2): since A_ij is a plain kernel matrix of
q~_i = phi(q_i) exp(b_i) and k~_j = phi(k_j) exp(-b_j),

    db_i = phi(q_i) * dphi(q_i) - phi(k_i) * dphi(k_i)   (+ S_N * dS_N summed over M at i = N),
    dg_l = sum_{i >= l} db_i                              (a reversed cumulative sum).

This module holds that shared wrapper (``gated``, ``gated_backward``) and the oracle, the
decayed kernel matrix (``product``, ``method="quadratic"``); ``decay_recurrent`` (running
sums, the step) and ``decay_chunked`` (blocks) are tested against it.
"""
from .._checks import array_module
from .normaliser import append_ones, stacked, unstacked
from .padding import drop_padded, zero_padded

FUSED_FEATURE_MAPS = ()  # every feature map is applied before the kernel
SUPPORTS = frozenset({"non_causal", "key_mask", "initial_state", "return_state", "decay",
                      "log_gate", "unnormalized"})  # dispatch; gates causal only


def cumulative(g):
    """b_i = sum_{l <= i} g_l along the positions: (..., N, F) -> (..., N, F)."""
    return array_module(g).cumsum(g, axis=-2)


def reverse_cumulative(db):
    """dg_l = sum_{i >= l} db_i: the gradient of ``cumulative``. (..., N, F)."""
    xp = array_module(db)
    return xp.flip(xp.cumsum(xp.flip(db, axis=-2), axis=-2), axis=-2)


def decays(b_rows, b_cols):
    """exp(b_i - b_j) for j <= i, else 0: (..., I, F), (..., J, F) -> (..., I, J, F), with
    row i and column j aligned at their ends' diagonal (I == J). The difference is masked
    before the exp, so no exponent is positive."""
    xp = array_module(b_rows)
    n = b_rows.shape[-2]
    diff = b_rows[..., :, None, :] - b_cols[..., None, :, :]             # (..., N, N, F)
    below = xp.tril(xp.ones((n, n), dtype=bool))[:, :, None]
    return xp.exp(xp.where(below, diff, -xp.inf))


def product(phi_q, phi_k, v, g, s0=None, chunk_size=None):
    """The oracle: num_i = sum_{j <= i} A_ij v_j + (phi_q_i * exp(b_i))^T S0, with the
    decayed kernel matrix A_ij = sum_f phi_q_if phi_k_jf exp(b_if - b_jf), and the final
    state S_N = diag(exp(b_N)) S0 + sum_j diag(exp(b_N - b_j)) phi_k_j v_j^T.

    Shapes: phi_q, phi_k, g (..., N, F); v (..., N, W); s0 (..., F, W) or None ->
    (num (..., N, W), S_N (..., F, W)). Cost: O(N^2 (F + W)) time, O(N^2 F) memory.
    """
    xp = array_module(v)
    b = cumulative(g)
    e = decays(b, b)                                                       # (..., N, N, F)
    a = xp.einsum("...if,...jf,...ijf->...ij", phi_q, phi_k, e)           # A_ij
    num = a @ v                                                            # (..., N, W)
    last = b[..., -1:, :] - b                                              # b_N - b_j <= 0
    final = (phi_k * xp.exp(last)).swapaxes(-1, -2) @ v                    # (..., F, W)
    if s0 is not None:
        num = num + (phi_q * xp.exp(b)) @ s0                               # S0's share
        final = final + xp.exp(b[..., -1, :])[..., :, None] * s0
    return num, final


def product_backward(dnum, phi_q, phi_k, v, g, s0=None, dfinal=None, chunk_size=None):
    """Backward of ``product`` with respect to phi_q, phi_k, v and S0: (dphi_q, dphi_k, dv,
    dS0 or None). ``dfinal`` (..., F, W) is the final state's gradient, or None.

    dA_ij = dnum_i . v_j (j <= i), dphi_q_if = sum_j dA_ij phi_k_jf E_ijf,
    dphi_k_jf = sum_i dA_ij phi_q_if E_ijf, dv = A^T dnum, with E_ijf = exp(b_if - b_jf);
    the state adds exp(b_i) S0 dnum_i to dphi_q_i, exp(b_N - b_j) (dS_N v_j) to dphi_k_j
    and exp(b_N - b_j) phi_k_j^T dS_N to dv_j;
    dS0 = sum_i exp(b_i) phi_q_i dnum_i^T + exp(b_N) dS_N.
    """
    xp = array_module(v)
    b = cumulative(g)
    e = decays(b, b)
    a = xp.einsum("...if,...jf,...ijf->...ij", phi_q, phi_k, e)
    da = dnum @ v.swapaxes(-1, -2)                            # (..., N, N); E masks j > i
    dphi_q = xp.einsum("...ij,...jf,...ijf->...if", da, phi_k, e)
    dphi_k = xp.einsum("...ij,...if,...ijf->...jf", da, phi_q, e)
    dv = a.swapaxes(-1, -2) @ dnum
    if dfinal is not None:
        k_last = phi_k * xp.exp(b[..., -1:, :] - b)           # phi_k_j exp(b_N - b_j)
        dphi_k = dphi_k + xp.exp(b[..., -1:, :] - b) * (v @ dfinal.swapaxes(-1, -2))
        dv = dv + k_last @ dfinal
    ds0 = None
    if s0 is not None:
        dphi_q = dphi_q + xp.exp(b) * (dnum @ s0.swapaxes(-1, -2))
        ds0 = (phi_q * xp.exp(b)).swapaxes(-1, -2) @ dnum     # (..., F, W)
        if dfinal is not None:
            ds0 = ds0 + xp.exp(b[..., -1, :])[..., :, None] * dfinal
    return dphi_q, dphi_k, dv, ds0


def _inputs(phi_k, v, g, key_mask, initial_state):
    """(phi_k, v1, g, s0): padded keys dropped (and their gates set to 0, so a padded
    position leaves the state as it was), v1 = [v, 1], S0 and z0 as one matrix [S0, z0].
    The normaliser's column is carried even unnormalised, so that the state's z is right."""
    xp = array_module(v)
    phi_k, v = drop_padded(phi_k, v, key_mask)
    if g is None:                                              # no gate: alpha = 1
        g = xp.zeros(phi_k.shape, dtype=v.dtype)
    elif key_mask is not None:
        g = xp.where(key_mask[..., None], g, g.dtype.type(0))
    s0 = None if initial_state is None else stacked(initial_state)    # (..., F, M + 1)
    return phi_k, append_ones(v), g, s0


def _all_keys(phi_q, phi_k, v1, g, s0=None, chunk_size=None):
    """Non-causal and ungated (the only non-causal case the checks let through): every query
    reads the whole sum, num_i = phi_q_i^T sum_j phi_k_j v_j^T, Eq. (6)."""
    total = phi_k.swapaxes(-1, -2) @ v1                              # (..., F, W)
    return phi_q @ total, total


def _all_keys_backward(dnum, phi_q, phi_k, v1, g, s0=None, dfinal=None, chunk_size=None):
    """Backward of ``_all_keys``: (dphi_q, dphi_k, dv1, None); g is 0 and unused."""
    total = phi_k.swapaxes(-1, -2) @ v1
    adj = phi_q.swapaxes(-1, -2) @ dnum                              # (..., F, W)
    return dnum @ total.swapaxes(-1, -2), v1 @ adj.swapaxes(-1, -2), phi_k @ adj, None


def gated(product, phi_q, phi_k, v, *, eps, log_gate=None, normalize=True, key_mask=None,
          initial_state=None, return_state=False, chunk_size=None, causal=True):
    """out = num / (den + eps) with [num, den] = product of [v, 1] (or out = num when not
    ``normalize``), for any gated ``product`` of this family. Returns ``(out, State)`` when
    ``return_state`` (z is carried unnormalised too, for a later normalised piece).
    Non-causal (no gate, no state: the checks refuse them), every query reads all keys."""
    product = product if causal else _all_keys
    phi_k, v1, g, s0 = _inputs(phi_k, v, log_gate, key_mask, initial_state)
    num1, final = product(phi_q, phi_k, v1, g, s0, chunk_size=chunk_size)
    out = num1[..., :-1] / (num1[..., -1:] + eps) if normalize else num1[..., :-1]
    return (out, unstacked(final)) if return_state else out


def gated_backward(product, product_backward, dout, phi_q, phi_k, v, *, eps, log_gate=None,
                   normalize=True, key_mask=None, initial_state=None, dstate=None,
                   chunk_size=None, causal=True):
    """Backward of ``gated``: (dphi_q, dphi_k, dv, dlog_gate), then State(dS0, dz0) when
    ``initial_state`` is given. dlog_gate is computed as the module docstring derives; it is
    0 at padded keys (their gate is not used) and when no gate was given."""
    if not causal:
        product, product_backward = _all_keys, _all_keys_backward
    xp = array_module(v)
    phi_k, v1, g, s0 = _inputs(phi_k, v, log_gate, key_mask, initial_state)
    num1, final = product(phi_q, phi_k, v1, g, s0, chunk_size=chunk_size)
    if normalize:
        den = num1[..., -1:] + eps                                   # (..., N, 1)
        dden = -(dout * num1[..., :-1] / den).sum(axis=-1, keepdims=True) / den
        dnum1 = xp.concatenate([dout / den, dden], axis=-1)          # (..., N, M + 1)
    else:                                                            # the column is unread
        dnum1 = xp.concatenate([dout, xp.zeros_like(dout[..., :1])], axis=-1)
    dfinal = None if dstate is None else stacked(dstate)
    dphi_q, dphi_k, dv1, ds0 = product_backward(dnum1, phi_q, phi_k, v1, g, s0, dfinal,
                                                chunk_size=chunk_size)
    if causal:
        db = phi_q * dphi_q - phi_k * dphi_k                         # (..., N, F)
        if dfinal is not None and db.shape[-2]:
            db[..., -1, :] += (final * dfinal).sum(axis=-1)          # b_N scales S_N
        dg = reverse_cumulative(db)
    else:                                                            # no gate to speak of
        dg = xp.zeros_like(phi_k)
    dphi_k, dv, dg = zero_padded(key_mask, dphi_k, dv1[..., :-1], dg)
    grads = (dphi_q, dphi_k, dv, dg)
    return grads if initial_state is None else (*grads, unstacked(ds0))


def attend(phi_q, phi_k, v, *, causal, eps, chunk_size=None, log_gate=None, normalize=True,
           key_mask=None, initial_state=None, return_state=False):
    """Gated causal linear attention by the decayed kernel matrix (the oracle).

    Parameters
    ----------
    phi_q, phi_k : ndarray, shape (..., N, F)
    v : ndarray, shape (..., N, M)
    log_gate : ndarray, shape (..., N, F), optional
        g_i = log alpha_i <= 0 (a scalar decay arrives folded in as log gamma); None: 1.
    normalize : bool
        Divide by phi(q_i)^T z_i + eps (the paper), or not (RetNet).
    key_mask, initial_state, return_state
        As for ``quadratic.attend``; S0 and z0 decay with the gates too.

    Returns
    -------
    out : ndarray, shape (..., N, M), or (out, State) with ``return_state``.

    Cost: O(N^2 (F + M)) time, O(N^2 F) memory. ``chunk_size`` is ignored.
    """
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
