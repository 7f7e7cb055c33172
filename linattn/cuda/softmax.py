"""Softmax attention on the GPU, the O(N^2) baseline: Eq. (2) of Katharopoulos et al. (2020),
arXiv:2006.16236, causal Eq. (8). The products q k^T, P v and their gradients are CuPy matrix
products; the row-wise stable softmax and its backward are kernels (softmax.cu). This is
``linattn.softmax_attention`` with ``backend="cupy"``. Oracle: ``linattn.forms.softmax``.
"""
from . import launch

SUPPORTS = frozenset({"non_causal"})  # options taken by keyword (dispatch)


def _probabilities(q, k, causal, scale):
    """P = softmax(scale q k^T) row by row, zero above the diagonal if causal: (..., Nq, Nk)."""
    p = launch.array_module(q).ascontiguousarray(q @ k.swapaxes(-1, -2))   # logits
    n = k.shape[-2]                        # the row length; causal rows are square (Nq == Nk)
    launch.launch("softmax.cu", "softmax_rows", (p.size // n if n else 0,),
                  (p, n, int(causal), float(scale)))
    return p


def attend(q, k, v, *, causal, scale):
    """out = softmax(scale q k^T) v, Eq. (2) / (8), on CuPy arrays q (..., Nq, D),
    k (..., Nk, D), v (..., Nk, M) -> (..., Nq, M).

    Cost: O(Nq Nk max(D, M)) time, O(Nq Nk) memory.
    """
    return _probabilities(q, k, causal, scale) @ v


def attend_backward(dout, q, k, v, *, causal, scale):
    """(dq, dk, dv) of ``softmax_attention``: dv = P^T dout, dP = dout v^T,
    dL = scale P * (dP - rowsum(dP * P)) (a kernel), dq = dL k, dk = dL^T q.

    Cost: O(Nq Nk max(D, M)) time, O(Nq Nk) memory (P is recomputed, not stored).
    """
    p = _probabilities(q, k, causal, scale)                  # (..., N, N)
    dv = p.swapaxes(-1, -2) @ dout
    dl = launch.array_module(q).ascontiguousarray(dout @ v.swapaxes(-1, -2))   # dP
    n = k.shape[-2]
    launch.launch("softmax.cu", "softmax_rows_backward", (dl.size // n if n else 0,),
                  (p, dl, n, float(scale)))                  # dP -> dL in place
    return dl @ k, dl.swapaxes(-1, -2) @ q, dv
