"""The normaliser as one more value column: the trick the fast forms share.

Appending a column of ones to v turns phi_q_i^T sum_j phi_k_j [v_j, 1]^T into
[numerator_i, denominator_i - eps] of Eq. (5) at once, so a form only has to compute the
unnormalised product out_i = phi_q_i^T sum_j phi_k_j v_j^T (the paper's "causal product")
and its backward. The functions here add the division and its gradient around any such pair.
"""
from .._checks import array_module


def append_ones(v):
    """[v, 1]: shape (..., N, M) -> (..., N, M + 1)."""
    xp = array_module(v)
    return xp.concatenate([v, xp.ones((*v.shape[:-1], 1), dtype=v.dtype)], axis=-1)


def normalised(product, phi_q, phi_k, v, eps, **kwargs):
    """out = num / (den + eps), with [num, den] = product(phi_q, phi_k, [v, 1]). Eq. (5)."""
    num1 = product(phi_q, phi_k, append_ones(v), **kwargs)  # (..., N, M + 1)
    return num1[..., :-1] / (num1[..., -1:] + eps)


def normalised_backward(product, product_backward, dout, phi_q, phi_k, v, eps, **kwargs):
    """Backward of ``normalised``: (dphi_q, dphi_k, dv).

    With out = num / den: dnum = dout / den and dden = -sum_m(dout * out) / den; both go
    back through the product as one (..., N, M + 1) gradient.
    """
    xp = array_module(v)
    v1 = append_ones(v)
    num1 = product(phi_q, phi_k, v1, **kwargs)
    den = num1[..., -1:] + eps                                    # (..., N, 1)
    out = num1[..., :-1] / den
    dden = -(dout * out).sum(axis=-1, keepdims=True) / den
    dnum1 = xp.concatenate([dout / den, dden], axis=-1)           # (..., N, M + 1)
    dphi_q, dphi_k, dv1 = product_backward(dnum1, phi_q, phi_k, v1, **kwargs)
    return dphi_q, dphi_k, dv1[..., :-1]
