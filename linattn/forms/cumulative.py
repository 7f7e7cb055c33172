"""Linear attention by associativity, Eq. (5)-(6), and for the causal case by running sums,
Eq. (9)-(12), with the O(N)-memory backward of section 3.3.1, Eq. (13)-(15), of
Katharopoulos et al. (2020), arXiv:2006.16236. This is ``method="linear"``.

The normaliser rides along as a column of ones appended to v (see ``normaliser``), so the
loops below are the paper's "causal product" alone. Oracle: ``quadratic``.
"""
from .._checks import array_module
from .normaliser import normalised, normalised_backward

FUSED_FEATURE_MAPS = ()  # every feature map is applied before the kernel
SUPPORTS = frozenset({"non_causal", "key_mask", "initial_state", "return_state"})  # dispatch


def product(phi_q, phi_k, v, causal):
    """out_i = phi_q_i^T S_i with S_i = sum_{j <= i} phi_k_j v_j^T (all j if not causal).

    Shapes: phi_q, phi_k (..., N, F); v (..., N, M) -> out (..., N, M).
    Cost: O(N F M) time, O(F M) memory beyond the output; the causal case is a Python loop
    over positions, vectorised over the leading axes.
    """
    xp = array_module(v)
    if not causal:
        return phi_q @ (phi_k.swapaxes(-1, -2) @ v)                # Eq. (6), S is (..., F, M)
    s = xp.zeros((*v.shape[:-2], phi_k.shape[-1], v.shape[-1]), dtype=v.dtype)
    out = xp.empty(v.shape, dtype=v.dtype)
    for i in range(v.shape[-2]):
        s += phi_k[..., i, :, None] * v[..., i, None, :]            # S_i = S_{i-1} + phi_k_i v_i^T
        out[..., i, :] = (phi_q[..., i, None, :] @ s)[..., 0, :]    # phi_q_i^T S_i, Eq. (12)
    return out


def product_backward(dout, phi_q, phi_k, v, causal):
    """Backward of ``product``: (dphi_q, dphi_k, dv), Eq. (13)-(15).

    dphi_q_i = S_i dout_i with S_i the running state (a forward loop), and with
    G_i = sum_{j >= i} phi_q_j dout_j^T (a reverse loop): dphi_k_i = G_i v_i, dv_i = G_i^T phi_k_i.
    Neither loop stores the N states: O(F M) memory beyond the gradients.
    """
    xp = array_module(v)
    if not causal:
        s = phi_k.swapaxes(-1, -2) @ v                               # (..., F, M)
        g = phi_q.swapaxes(-1, -2) @ dout                            # (..., F, M)
        return dout @ s.swapaxes(-1, -2), v @ g.swapaxes(-1, -2), phi_k @ g
    n = v.shape[-2]
    state_shape = (*v.shape[:-2], phi_k.shape[-1], v.shape[-1])
    dphi_q, dphi_k, dv = xp.empty_like(phi_q), xp.empty_like(phi_k), xp.empty_like(v)
    s = xp.zeros(state_shape, dtype=v.dtype)
    for i in range(n):
        s += phi_k[..., i, :, None] * v[..., i, None, :]
        dphi_q[..., i, :] = (s @ dout[..., i, :, None])[..., 0]      # Eq. (13)
    g = xp.zeros(state_shape, dtype=v.dtype)
    for i in reversed(range(n)):
        # G_i = G_{i+1} + phi_q_i dout_i^T
        g += phi_q[..., i, :, None] * dout[..., i, None, :]
        dphi_k[..., i, :] = (g @ v[..., i, :, None])[..., 0]         # Eq. (14)
        dv[..., i, :] = (phi_k[..., i, None, :] @ g)[..., 0, :]      # Eq. (15)
    return dphi_q, dphi_k, dv


def attend(phi_q, phi_k, v, *, causal, eps, chunk_size=None, key_mask=None,
           initial_state=None, return_state=False):
    """Normalised linear attention, Eq. (5) / (9). Shapes (..., N, F), (..., N, M) -> (..., N, M).
    ``chunk_size`` is ignored; the key mask and states as in ``padding`` (with the state:
    ``(out, State)``)."""
    return normalised(product, phi_q, phi_k, v, eps, causal=causal, key_mask=key_mask,
                      initial_state=initial_state, return_state=return_state)


def attend_backward(dout, phi_q, phi_k, v, *, causal, eps, chunk_size=None, key_mask=None,
                    initial_state=None, dstate=None):
    """Backward of ``attend``: (dphi_q, dphi_k, dv), Eq. (13)-(15) plus the normaliser, and
    the initial state's gradient when one is given."""
    return normalised_backward(product, product_backward, dout, phi_q, phi_k, v, eps,
                               causal=causal, key_mask=key_mask, initial_state=initial_state,
                               dstate=dstate)
