"""The normaliser as one more value column: the trick the fast forms share.

Appending a column of ones to v turns phi_q_i^T sum_j phi_k_j [v_j, 1]^T into
[numerator_i, denominator_i - eps] of Eq. (5) at once, so a form only has to compute the
unnormalised product out_i = phi_q_i^T sum_j phi_k_j v_j^T (the paper's "causal product")
and its backward. The functions here add the division and its gradient around any such pair,
with the key padding of ``padding`` and a state handed over from earlier positions.

A state (S0, z0) handed over enters every causal readout (Eq. 20):
    out_i = phi(q_i)^T (S0 + S_i) / (phi(q_i)^T (z0 + z_i) + eps),
and the final state is (S0 + S_N, z0 + z_N). With the normaliser as the column of ones, S0 and
z0 are one (..., F, M + 1) matrix [S0, z0]: ``with_state`` and ``with_state_backward`` add it
around any causal product. The quadratic form, the oracle, writes it out itself.
"""
from .._checks import array_module
from .padding import drop_padded, zero_padded
from .recurrent import State


def append_ones(v):
    """[v, 1]: shape (..., N, M) -> (..., N, M + 1)."""
    xp = array_module(v)
    return xp.concatenate([v, xp.ones((*v.shape[:-1], 1), dtype=v.dtype)], axis=-1)


def stacked(state):
    """State(S (..., F, M), z (..., F)) -> [S, z] (..., F, M + 1), the normaliser's column."""
    xp = array_module(state.S)
    return xp.concatenate([state.S, state.z[..., None]], axis=-1)


def unstacked(s1):
    """[S, z] (..., F, M + 1) -> State(S, z)."""
    return State(s1[..., :-1], s1[..., -1])


def with_state(num1, phi_q, phi_k, v1, initial_state, return_state):
    """The causal product ``num1`` (..., N, M + 1) of (phi_q, phi_k, v1) plus what the state
    handed over adds: phi_q_i^T [S0, z0] for each query; and, if ``return_state``, the final
    state [S0, z0] + sum_j phi_k_j [v_j, 1]^T as a ``State`` (None otherwise)."""
    s1 = None if initial_state is None else stacked(initial_state)          # (..., F, M + 1)
    if s1 is not None:
        num1 = num1 + phi_q @ s1                                             # Eq. (20), S0 part
    final = None
    if return_state:
        total = phi_k.swapaxes(-1, -2) @ v1                                  # (..., F, M + 1)
        final = unstacked(total if s1 is None else s1 + total)
    return num1, final


def with_state_backward(dnum1, phi_q, phi_k, v1, initial_state, dstate):
    """What ``with_state`` adds to the gradients: (dphi_q, dphi_k, dv1, d[S0, z0]), each None
    where nothing is added. ``dstate`` is the gradient of the final state (or None).

    num1_i += phi_q_i^T [S0, z0]  gives  dphi_q_i += [S0, z0] dnum1_i,  d[S0, z0] = phi_q^T dnum1;
    final = [S0, z0] + phi_k^T v1  gives  dphi_k += v1 dfinal^T,  dv1 += phi_k dfinal,
    d[S0, z0] += dfinal.
    """
    dphi_q = dphi_k = dv1 = ds1 = None
    if initial_state is not None:
        s1 = stacked(initial_state)
        dphi_q = dnum1 @ s1.swapaxes(-1, -2)                                  # (..., N, F)
        ds1 = phi_q.swapaxes(-1, -2) @ dnum1                                  # (..., F, M + 1)
    if dstate is not None:
        dfinal = stacked(dstate)                                              # (..., F, M + 1)
        dphi_k = v1 @ dfinal.swapaxes(-1, -2)                                 # (..., N, F)
        dv1 = phi_k @ dfinal                                                  # (..., N, M + 1)
        if ds1 is not None:
            ds1 = ds1 + dfinal
    return dphi_q, dphi_k, dv1, ds1


def normalised(product, phi_q, phi_k, v, eps, *, key_mask=None, initial_state=None,
               return_state=False, **kwargs):
    """out = num / (den + eps), with [num, den] = product(phi_q, phi_k, [v, 1]). Eq. (5).

    Padded keys (``key_mask`` False) are dropped first, and a causal product gets the state
    handed over (``with_state``): returns ``(out, State)`` when ``return_state``.
    """
    phi_k, v = drop_padded(phi_k, v, key_mask)
    v1 = append_ones(v)
    num1 = product(phi_q, phi_k, v1, **kwargs)                 # (..., N, M + 1)
    num1, final = with_state(num1, phi_q, phi_k, v1, initial_state, return_state)
    out = num1[..., :-1] / (num1[..., -1:] + eps)
    return (out, final) if return_state else out


def normalised_backward(product, product_backward, dout, phi_q, phi_k, v, eps, *,
                        key_mask=None, initial_state=None, dstate=None, **kwargs):
    """Backward of ``normalised``: (dphi_q, dphi_k, dv), and the gradient of the initial
    state as a ``State`` when one is given; ``dstate`` is the gradient of the final state.

    With out = num / den: dnum = dout / den and dden = -sum_m(dout * out) / den; both go
    back through the product as one (..., N, M + 1) gradient. The gradients of padded keys
    and values are exactly 0.
    """
    xp = array_module(v)
    phi_k, v = drop_padded(phi_k, v, key_mask)
    v1 = append_ones(v)
    num1 = product(phi_q, phi_k, v1, **kwargs)
    num1, _ = with_state(num1, phi_q, phi_k, v1, initial_state, False)
    den = num1[..., -1:] + eps                                    # (..., N, 1)
    out = num1[..., :-1] / den
    dden = -(dout * out).sum(axis=-1, keepdims=True) / den
    dnum1 = xp.concatenate([dout / den, dden], axis=-1)           # (..., N, M + 1)
    dphi_q, dphi_k, dv1 = product_backward(dnum1, phi_q, phi_k, v1, **kwargs)
    extra_q, extra_k, extra_v1, ds1 = with_state_backward(dnum1, phi_q, phi_k, v1,
                                                          initial_state, dstate)
    if extra_q is not None:
        dphi_q = dphi_q + extra_q
    if extra_k is not None:
        dphi_k, dv1 = dphi_k + extra_k, dv1 + extra_v1
    dphi_k, dv = zero_padded(key_mask, dphi_k, dv1[..., :-1])
    grads = (dphi_q, dphi_k, dv)
    return grads if initial_state is None else (*grads, unstacked(ds1))
