"""v1 of the CUDA causal product: the running sums of Eq. (10)-(12), one GPU thread per output
column walking all N positions (``scan_product`` in causal_product.cu), and the O(N)-memory
backward of section 3.3.1, Eq. (13)-(15), as three more such scans. Katharopoulos et al. (2020),
arXiv:2006.16236. This is ``method="linear"`` (and ``"recurrent"``) with ``backend="cupy"``.

Simple and obviously correct, and slow: only H x M threads, each O(N F) sequential work. The
normaliser is the extra value column of ones of ``linattn.forms.normaliser``. Causal only: the
dispatch table sends non-causal calls to ``linattn.forms.cumulative`` (two CuPy matrix
products). Oracle: the NumPy backend.
"""
from ..forms.normaliser import normalised, normalised_backward
from .._checks import rows
from . import launch

FUSED_FEATURE_MAPS = ()  # every feature map is applied before the kernel
SUPPORTS = frozenset()  # causal only: dispatch sends the rest to NumPy's forms


def _scan(a, b, c, reverse):
    """out_i[p] = sum_r (sum_{j <= i} a_j[p] b_j[r]) c_i[r] (j >= i if reverse), per head.

    Shapes: a (..., N, P), b and c (..., N, R) -> out (..., N, P). O(N P R) time, O(P R)
    memory per head for the running sums.
    """
    xp = launch.array_module(a)
    a3, b3, c3 = (rows(x) for x in (a, b, c))
    h, n, p = a3.shape
    r = b3.shape[-1]
    state = xp.zeros((h, p, r), dtype=a3.dtype)             # one running sum per thread
    out = xp.empty_like(a3)
    launch.launch("causal_product.cu", "scan_product", (launch.blocks(h * p),),
                  (a3, b3, c3, state, out, h, n, p, r, int(reverse)))
    return out.reshape(a.shape)


def product(phi_q, phi_k, v, causal):
    """out_i = phi_q_i^T S_i, S_i = sum_{j <= i} phi_k_j v_j^T (all j if not causal), Eq. (12).

    Shapes: phi_q, phi_k (..., N, F); v (..., N, M) -> out (..., N, M).
    """
    launch.require_causal(causal)
    return _scan(v, phi_k, phi_q, reverse=False)


def product_backward(dout, phi_q, phi_k, v, causal):
    """Backward of ``product``: (dphi_q, dphi_k, dv), Eq. (13)-(15), as four scans.

    dphi_q_i = S_i dout_i (forward in time); with G_i = sum_{j >= i} phi_q_j dout_j^T
    (backward in time): dphi_k_i = G_i v_i, dv_i = G_i^T phi_k_i. No state is stored.
    """
    launch.require_causal(causal)
    dphi_q = _scan(phi_k, v, dout, reverse=False)            # S_i dout_i
    dphi_k = _scan(phi_q, dout, v, reverse=True)             # G_i v_i
    dv = _scan(dout, phi_q, phi_k, reverse=True)             # G_i^T phi_k_i
    return dphi_q, dphi_k, dv


def attend(phi_q, phi_k, v, *, causal, eps, chunk_size=None):
    """Normalised linear attention, Eq. (5) / (9), on CuPy arrays (..., N, F), (..., N, M).
    ``chunk_size`` is ignored."""
    if v.size == 0:
        return v.copy()
    return normalised(product, phi_q, phi_k, v, eps, causal=causal)


def attend_backward(dout, phi_q, phi_k, v, *, causal, eps, chunk_size=None):
    """Backward of ``attend``: (dphi_q, dphi_k, dv)."""
    if v.size == 0:                                          # N = 0, M = 0 or no heads
        xp = launch.array_module(v)
        return xp.zeros_like(phi_q), xp.zeros_like(phi_k), v.copy()
    return normalised_backward(product, product_backward, dout, phi_q, phi_k, v, eps,
                               causal=causal)
