"""Linear attention computed the quadratic way: the (masked) N x N kernel matrix
phi(Q) phi(K)^T, the left side of Eq. (6) (Eq. 4 non-causal, Eq. 8 causal) of
Katharopoulos et al. (2020), arXiv:2006.16236.

This is the oracle: every other method and backend is tested against it.
"""
from .._checks import array_module
from .recurrent import State

FUSED_FEATURE_MAPS = ()  # every feature map is applied before the kernel
SUPPORTS = frozenset({"non_causal", "key_mask", "initial_state", "return_state"})  # dispatch


def masked(a, causal):
    """``a`` (..., N, N) with zeros above the diagonal if causal (where, not *: 0 * NaN)."""
    if not causal:
        return a
    xp = array_module(a)
    n = a.shape[-1]
    return xp.where(xp.tril(xp.ones((n, n), dtype=bool)), a, 0)


def _kernel_matrix(phi_q, phi_k, causal, key_mask=None):
    """A_ij = phi_q_i . phi_k_j, zero above the diagonal if causal and in the columns of padded
    keys (``key_mask`` (..., Nk) False). Shape (..., Nq, Nk)."""
    return _columns(masked(phi_q @ phi_k.swapaxes(-1, -2), causal), key_mask)


def _columns(a, key_mask):
    """a (..., Nq, Nk) with the columns of padded keys 0."""
    if key_mask is None:
        return a
    return array_module(a).where(key_mask[..., None, :], a, a.dtype.type(0))


def _real(x, key_mask):
    """x (..., Nk, W) with the rows of padded keys 0 (where, not *: padding may be NaN)."""
    if key_mask is None:
        return x
    return array_module(x).where(key_mask[..., None], x, x.dtype.type(0))


def attend(phi_q, phi_k, v, *, causal, eps, chunk_size=None, key_mask=None,
           initial_state=None, return_state=False):
    """out_i = (sum_j A_ij v_j + phi_q_i^T S0) / (sum_j A_ij + phi_q_i^T z0 + eps), Eq. (4) /
    (8), with every option written out: A_ij = 0 for a padded key j (``key_mask`` False),
    (S0, z0) the state handed over (``initial_state``, zero when None).

    Parameters
    ----------
    phi_q : ndarray, shape (..., Nq, F)
    phi_k : ndarray, shape (..., Nk, F)
    v : ndarray, shape (..., Nk, M)
    key_mask : ndarray of bool, shape (..., Nk), optional
    initial_state : State, optional
        S0 (..., F, M), z0 (..., F).
    return_state : bool
        Also return the final state S0 + sum_j phi_k_j v_j^T, z0 + sum_j phi_k_j (real j).

    Returns
    -------
    out : ndarray, shape (..., Nq, M), or (out, State) if ``return_state``.

    Cost: O(N^2 max(F, M)) time, O(N^2) memory. ``chunk_size`` is ignored.
    """
    a = _kernel_matrix(phi_q, phi_k, causal, key_mask)    # (..., Nq, Nk)
    v = _real(v, key_mask)                                # a padded value may be NaN
    num = a @ v                                           # (..., Nq, M)
    den = a.sum(axis=-1, keepdims=True)                   # (..., Nq, 1)
    if initial_state is not None:
        num = num + phi_q @ initial_state.S               # phi_q_i^T S0
        den = den + phi_q @ initial_state.z[..., :, None]  # phi_q_i^T z0
    out = num / (den + eps)
    if not return_state:
        return out
    phi_k = _real(phi_k, key_mask)
    S = phi_k.swapaxes(-1, -2) @ v                        # (..., F, M): sum_j phi_k_j v_j^T
    z = phi_k.sum(axis=-2)                                # (..., F): sum_j phi_k_j
    if initial_state is not None:
        S, z = initial_state.S + S, initial_state.z + z
    return out, State(S, z)


def attend_backward(dout, phi_q, phi_k, v, *, causal, eps, chunk_size=None, key_mask=None,
                    initial_state=None, dstate=None):
    """Backward of ``attend``: (dphi_q, dphi_k, dv), shapes as phi_q, phi_k, v, and
    State(dS0, dz0) when ``initial_state`` is given; ``dstate`` (dS, dz) is the gradient of
    the final state, if it was returned and used.

    dnum = dout / den, dden = -rowsum(dout * out) / den, dA = dnum v^T + dden (masked),
    dv = A^T dnum + phi_k dS, dphi_q = dA phi_k + S0 dnum + z0 dden,
    dphi_k = dA^T phi_q + v dS^T + dz, dS0 = phi_q^T dnum + dS, dz0 = phi_q^T dden + dz;
    rows of padded keys 0.
    """
    a = _kernel_matrix(phi_q, phi_k, causal, key_mask)
    phi_k, v = _real(phi_k, key_mask), _real(v, key_mask)
    num, den = a @ v, a.sum(axis=-1, keepdims=True)
    if initial_state is not None:
        num = num + phi_q @ initial_state.S
        den = den + phi_q @ initial_state.z[..., :, None]
    den = den + eps
    out = num / den
    dnum = dout / den                                      # (..., Nq, M)
    dden = -(dout * out).sum(axis=-1, keepdims=True) / den  # (..., Nq, 1)
    da = _columns(masked(dnum @ v.swapaxes(-1, -2) + dden, causal), key_mask)  # (..., Nq, Nk)
    dphi_q = da @ phi_k
    dphi_k = da.swapaxes(-1, -2) @ phi_q
    dv = a.swapaxes(-1, -2) @ dnum
    if dstate is not None:                                 # the final state's gradient
        dphi_k = dphi_k + v @ dstate.S.swapaxes(-1, -2) + dstate.z[..., None, :]
        dv = dv + phi_k @ dstate.S
    dphi_k, dv = _real(dphi_k, key_mask), _real(dv, key_mask)
    if initial_state is None:
        return dphi_q, dphi_k, dv
    dphi_q = (dphi_q + dnum @ initial_state.S.swapaxes(-1, -2)     # S0 dnum_i
              + dden * initial_state.z[..., None, :])                # z0 dden_i
    dS0 = phi_q.swapaxes(-1, -2) @ dnum                    # (..., F, M)
    dz0 = (phi_q * dden).sum(axis=-2)                      # (..., F)
    if dstate is not None:
        dS0, dz0 = dS0 + dstate.S, dz0 + dstate.z
    return dphi_q, dphi_k, dv, State(dS0, dz0)
