"""``method="linear"`` (and ``"recurrent"``) on the Numba backend: the running sums of
Eq. (9)-(12) as compiled loops over positions, the RNN of section 3.4 scanned in place, with
the O(N)-memory backward of section 3.3.1 (Katharopoulos et al. 2020, arXiv:2006.16236).

The loops are ``products.causal_product`` / ``global_product``; this module only picks the
number of state blocks per row so that every core has work. Oracle: ``forms.quadratic``.
"""
import math

import numba

from . import normaliser, products
from .padding import NONE
from ..feature_maps import EluPlusOne

FUSED_FEATURE_MAPS = (EluPlusOne,)  # applied by the kernel itself to raw q, k (elu=True)
# options taken by keyword (dispatch)
SUPPORTS = frozenset({"non_causal", "key_mask", "initial_state", "return_state"})

MIN_BLOCK = 16  # rows or columns of the state per unit


def n_blocks(rows, width):
    """State blocks per row (of a state ``width`` wide): enough units for every thread, in
    equal shares, and at least ``MIN_BLOCK`` wide each. rows = 1 on two threads gives two."""
    threads = numba.get_num_threads()
    return max(1, min(threads // math.gcd(rows, threads), width // MIN_BLOCK))


def _eps(eps, dtype):
    """eps in the kernels' dtype; -1 (no normaliser) for None."""
    return dtype.type(-1 if eps is None else eps)


def causal_loops(a, b, c, *, reverse, eps, out, den, start=None):
    """The causal product, Eq. (9)-(12), into ``out`` (see ``normaliser``), its state
    starting from ``start`` (rows, see ``products.causal_product``) when given."""
    start = NONE.astype(out.dtype) if start is None else start
    products.causal_product(a, b, c, reverse, _eps(eps, out.dtype), out, den,
                            n_blocks(a.shape[0], a.shape[-1]), start)


def global_loops(a, b, c, *, reverse, eps, out, den, start=None):
    """The non-causal product, Eq. (5)-(6), into ``out``; ``reverse`` changes nothing, and
    ``start`` is never given (states are causal only)."""
    products.global_product(a, b, c, _eps(eps, out.dtype), out, den,
                            n_blocks(a.shape[0], out.shape[-1]))


def attend(phi_q, phi_k, v, *, causal, eps, chunk_size=None, elu=False, key_mask=None,
           initial_state=None, return_state=False):
    """Normalised linear attention, Eq. (5) / (9)-(12): (..., N, F), (..., N, M) -> (..., N, M).

    With ``elu``, phi_q and phi_k are the raw q and k (elu+1, Eq. 7, is applied here).
    ``key_mask``, ``initial_state`` and ``return_state`` as in ``linear_attention`` (with
    ``return_state``: ``(out, State)``); see ``normaliser``.
    Cost: O(N F M) time, O(N (F + M)) memory. ``chunk_size`` is ignored.
    """
    product = causal_loops if causal else global_loops
    return normaliser.attend(product, phi_q, phi_k, v, eps, elu, key_mask=key_mask,
                             initial_state=initial_state, return_state=return_state)


def attend_backward(dout, phi_q, phi_k, v, *, causal, eps, chunk_size=None, elu=False,
                    key_mask=None, initial_state=None, dstate=None):
    """Backward of ``attend``: (dphi_q, dphi_k, dv), Eq. (13)-(15) plus the normaliser, or
    (dq, dk, dv) with ``elu``, then State(dS0, dz0) when ``initial_state`` is given. Four
    products, O(N (F + M)) memory (section 3.3.1)."""
    product = causal_loops if causal else global_loops
    return normaliser.attend_backward(product, dout, phi_q, phi_k, v, eps, elu,
                                      key_mask=key_mask, initial_state=initial_state,
                                      dstate=dstate)
