"""Key padding and states handed over, for the Numba kernels of linear attention: what
``chunked``, ``loops`` and ``quadratic`` share to take ``key_mask``, ``initial_state``,
``return_state`` and ``dstate`` (Katharopoulos et al. (2020), arXiv:2006.16236, Eq. 9-12
and the RNN's state, Eq. 16-20).

Padding. A padded key adds nothing to any sum: phi(k_j) = 0 and v_j = 0 (``drop_padded``),
set with ``where`` before the kernels, so padding may hold anything, NaN included. A kernel
that fuses elu+1 (Eq. 7) reads the raw k: there the padded rows become -inf, whose feature
is exactly 0 (phi(-inf) = exp(-inf) = 0, ``elu.exp32`` / ``exp64`` included), and whose
derivative, exp(-inf) = 0, stops the chain rule at them; nothing else reads raw k. The
kernels then run unchanged; ``zero_padded`` makes the gradients of padded keys exactly 0
after them (a final state's gradient dz reaches every key, padded ones too, Eq. 14).

States. The kernels keep S (F, M) and z (F,) side by side; they take a state handed over,
and return one, as [S, z] (F, M + 1), the normaliser's column of ``forms.normaliser``, one
array per row: ``start_rows`` and ``state_of``.
Oracle: ``forms.padding`` and ``forms.normaliser`` (NumPy).
"""
import numpy as np

from .._checks import rows
from ..forms.normaliser import stacked, unstacked
from ..forms.padding import zero_padded

__all__ = ["drop_padded", "zero_padded", "start_rows", "state_of", "NONE"]

NONE = np.empty((0, 0, 0))   # an option absent: an empty array of rows (cast to the dtype)


def drop_padded(x_k, v, key_mask, elu):
    """(x_k, v) with the rows of padded keys replaced so that phi(k_j) = 0 and v_j = 0:
    x_k (..., Nk, F) is phi(k) (set to 0), or the raw k with ``elu`` (set to -inf, whose
    elu+1 is 0); v (..., Nk, M) set to 0. Unchanged when ``key_mask`` (..., Nk) is None."""
    if key_mask is None:
        return x_k, v
    real = key_mask[..., None]                                   # (..., Nk, 1)
    blank = x_k.dtype.type(-np.inf if elu else 0)
    return np.where(real, x_k, blank), np.where(real, v, v.dtype.type(0))


def start_rows(state, dtype):
    """State(S (..., F, M), z (..., F)) -> [S, z] as C-contiguous rows (R, F, M + 1), R the
    product of the leading axes; None -> an empty (0, 0, 0) array (the kernels start from
    zeros)."""
    if state is None:
        return NONE.astype(dtype)
    return rows(stacked(state)).astype(dtype, copy=False)


def state_of(s1_rows, lead):
    """[S, z] rows (R, F, M + 1) -> State(S (*lead, F, M), z (*lead, F))."""
    return unstacked(s1_rows.reshape(*lead, *s1_rows.shape[1:]))
