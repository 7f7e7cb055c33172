"""Key padding: what the NumPy forms share to attend over a batch of sequences of different
lengths in one call. Katharopoulos et al. (2020), arXiv:2006.16236, sections 3.2-3.3.

A padded key adds nothing to any sum: its features phi(k_j) and its value v_j are replaced by
0 (``drop_padded``) after the feature map, so the numerator sum_j phi(k_j) v_j^T and the
normaliser sum_j phi(k_j) of Eq. (5) / (9) skip it, and a causal state S_i, z_i of Eq.
(10)-(11) is left as it was. ``where``, not a product, so padding may hold anything, NaN
included. Their gradients are replaced by 0 the same way (``zero_padded``).
"""
from .._checks import array_module


def drop_padded(phi_k, v, key_mask):
    """(phi_k, v) with the rows of padded keys set to 0; unchanged when ``key_mask`` is None.

    phi_k (..., Nk, F), v (..., Nk, M), key_mask bool (..., Nk), True for a real key.
    """
    if key_mask is None:
        return phi_k, v
    xp = array_module(v)
    real = key_mask[..., None]                                  # (..., Nk, 1)
    return xp.where(real, phi_k, phi_k.dtype.type(0)), xp.where(real, v, v.dtype.type(0))


def zero_padded(key_mask, *grads):
    """The gradients (..., Nk, W) with the rows of padded keys set to exactly 0."""
    if key_mask is None:
        return grads
    xp = array_module(grads[0])
    return tuple(xp.where(key_mask[..., None], g, g.dtype.type(0)) for g in grads)
