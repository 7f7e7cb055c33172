"""Linear attention computed the quadratic way: the (masked) N x N kernel matrix
phi(Q) phi(K)^T, the left side of Eq. (6) (Eq. 4 non-causal, Eq. 8 causal) of
Katharopoulos et al. (2020), arXiv:2006.16236.

This is the oracle: every other method and backend is tested against it.
"""
from .._checks import array_module

FUSED_FEATURE_MAPS = ()  # every feature map is applied before the kernel
SUPPORTS = frozenset({"non_causal"})  # options taken by keyword (dispatch)


def masked(a, causal):
    """``a`` (..., N, N) with zeros above the diagonal if causal (where, not *: 0 * NaN)."""
    if not causal:
        return a
    xp = array_module(a)
    n = a.shape[-1]
    return xp.where(xp.tril(xp.ones((n, n), dtype=bool)), a, 0)


def _kernel_matrix(phi_q, phi_k, causal):
    """A_ij = phi_q_i . phi_k_j, zero above the diagonal if causal. Shape (..., N, N)."""
    return masked(phi_q @ phi_k.swapaxes(-1, -2), causal)


def attend(phi_q, phi_k, v, *, causal, eps, chunk_size=None):
    """out_i = sum_j A_ij v_j / (sum_j A_ij + eps), Eq. (4) / (8).

    Parameters
    ----------
    phi_q, phi_k : ndarray, shape (..., N, F)
    v : ndarray, shape (..., N, M)

    Returns
    -------
    out : ndarray, shape (..., N, M)

    Cost: O(N^2 max(F, M)) time, O(N^2) memory. ``chunk_size`` is ignored.
    """
    a = _kernel_matrix(phi_q, phi_k, causal)              # (..., N, N)
    num = a @ v                                           # (..., N, M)
    den = a.sum(axis=-1, keepdims=True) + eps             # (..., N, 1)
    return num / den


def attend_backward(dout, phi_q, phi_k, v, *, causal, eps, chunk_size=None):
    """Backward of ``attend``: (dphi_q, dphi_k, dv), shapes as phi_q, phi_k, v.

    dnum = dout / den, dden = -rowsum(dout * out) / den, dA = dnum v^T + dden (masked),
    dv = A^T dnum, dphi_q = dA phi_k, dphi_k = dA^T phi_q.
    """
    a = _kernel_matrix(phi_q, phi_k, causal)
    den = a.sum(axis=-1, keepdims=True) + eps
    out = (a @ v) / den
    dnum = dout / den                                      # (..., N, M)
    dden = -(dout * out).sum(axis=-1, keepdims=True) / den  # (..., N, 1)
    da = masked(dnum @ v.swapaxes(-1, -2) + dden, causal)  # (..., N, N)
    dv = a.swapaxes(-1, -2) @ dnum
    return da @ phi_k, da.swapaxes(-1, -2) @ phi_q, dv
