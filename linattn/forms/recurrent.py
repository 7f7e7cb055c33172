"""Linear attention as an RNN, Eq. (16)-(20), section 3.4 of Katharopoulos et al. (2020),
arXiv:2006.16236: the state (S, z) starts at zero (Eq. 16-17), is updated one position at a
time (Eq. 18-19) and read out by the attention part of Eq. (20). This is
``method="recurrent"``: a scan of ``step`` over the sequence.

``linattn.linear_attention_step`` is ``step`` behind the feature map and input checks;
``linattn.Recurrence`` calls ``step_into``, the same step writing into the state it is given,
or ``step_into_compensated``, which adds by Kahan's compensated summation (``kahan_add_``;
the state is then a ``CompensatedState``), so that a float32 state stays within a few units
of float32 rounding of the float64 one however long the sequence (notebook 09 derives and
measures it).
Oracle: ``quadratic``; this module is in turn the oracle of the Numba and CUDA steps.
"""
from typing import NamedTuple

from .._checks import array_module
from .padding import drop_padded, zero_padded

FUSED_FEATURE_MAPS = ()  # every feature map is applied before the kernel
SUPPORTS = frozenset({"non_causal", "key_mask", "initial_state", "return_state"})  # dispatch


class State(NamedTuple):
    """The recurrent state of the RNN of Eq. (16)-(20) after positions 1..i: s_i and z_i of
    Eq. (18)-(19), zero before the first position (Eq. 16-17).

    S : ndarray, shape (..., F, M)
        Attention memory, sum_j phi(k_j) v_j^T.
    z : ndarray, shape (..., F)
        Normaliser memory, sum_j phi(k_j).
    """

    S: object
    z: object


class CompensatedState(NamedTuple):
    """The RNN state with Kahan's compensation terms: S and z as in ``State``, and beside
    each the rounding error its additions have lost so far, negated (``kahan_add_``). The
    sums are S and z themselves (read out as they are); S_c and z_c only correct the next
    additions.

    S : ndarray, shape (..., F, M)
    z : ndarray, shape (..., F)
    S_c : ndarray, shape (..., F, M)
    z_c : ndarray, shape (..., F)
    """

    S: object
    z: object
    S_c: object
    z_c: object


def zero_state(lead, f, m, dtype, xp, compensated=False):
    """The empty memory s_0 = 0, z_0 = 0 of Eq. (16)-(17), for leading shape ``lead``: a
    ``State``, or with ``compensated`` a ``CompensatedState`` whose compensation is 0 too."""
    s, z = xp.zeros((*lead, f, m), dtype=dtype), xp.zeros((*lead, f), dtype=dtype)
    if compensated:
        return CompensatedState(s, z, xp.zeros_like(s), xp.zeros_like(z))
    return State(s, z)


def update(state, phi_k, v):
    """s_i = s_{i-1} + phi(k_i) v_i^T, z_i = z_{i-1} + phi(k_i): Eq. (18)-(19).
    phi_k (..., F), v (..., M)."""
    return State(state.S + phi_k[..., :, None] * v[..., None, :], state.z + phi_k)


def readout(phi_q, state, eps):
    """phi(q)^T S / (phi(q)^T z + eps) for queries phi_q (..., N, F) -> (..., N, M), Eq. (20)."""
    num = phi_q @ state.S                                  # (..., N, M)
    den = phi_q @ state.z[..., :, None] + eps              # (..., N, 1)
    return num / den


def step(phi_q, phi_k, v, state, eps):
    """One position: update the state with (phi_k, v), then read it out with phi_q.

    phi_q, phi_k (..., F); v (..., M); state (S (..., F, M), z (..., F)).
    Returns (out (..., M), new state). Cost O(F M), independent of the position.
    """
    state = update(state, phi_k, v)
    return readout(phi_q[..., None, :], state, eps)[..., 0, :], state


def kahan_add_(total, lost, term):
    """total += term in place, by Kahan's compensated summation; ``lost`` (total's shape) is
    updated in place too.

        y = term - lost          the term, less what the additions before it lost
        t = total + y            the new sum, rounded
        lost = (t - total) - y   (t - total) is the part of y that reached t; less y, what
                                 this rounding lost, negated
        total = t

    Each operation is one rounded NumPy operation, in this order: the Numba and CUDA
    kernels do exactly these, so their compensated states equal this one bit for bit.
    """
    y = term - lost
    t = total + y
    lost[...] = (t - total) - y
    total[...] = t


def step_into(phi_q, phi_k, v, S, z, out, eps):
    """``step`` in place: S += phi_k v^T and z += phi_k, Eq. (18)-(19), then the readout
    with phi_q, Eq. (20), written into ``out``.

    Parameters
    ----------
    phi_q, phi_k : ndarray, shape (..., F)
    v : ndarray, shape (..., M)
    S : ndarray, shape (..., F, M)
    z : ndarray, shape (..., F)
        The state, in v's dtype, updated in place.
    out : ndarray, shape (..., M)
        Written with phi(q)^T S_i / (phi(q)^T z_i + eps).
    eps : scalar

    Cost: O(F M) time per leading index; O(F M) temporary memory for the term phi_k v^T.
    """
    S += phi_k[..., :, None] * v[..., None, :]               # S_i = S_{i-1} + phi(k_i) v_i^T
    z += phi_k                                              # z_i = z_{i-1} + phi(k_i)
    out[...] = readout(phi_q[..., None, :], State(S, z), eps)[..., 0, :]


def step_into_compensated(phi_q, phi_k, v, S, z, S_c, z_c, out, eps):
    """``step_into`` with Kahan's compensated summation: S and z updated in place by
    ``kahan_add_``, with S_c (S's shape) and z_c (z's shape) their compensation, also updated
    in place (a ``CompensatedState`` holds the four).

    The readout uses S and z as they are, not S - S_c: the compensation is at most about
    half a unit in the last place of S, so S - S_c would round back to S (or to a neighbour,
    at a tie), and the readout's own rounding is larger. Cost: as ``step_into``.
    """
    kahan_add_(S, S_c, phi_k[..., :, None] * v[..., None, :])   # S_i, Eq. (18), compensated
    kahan_add_(z, z_c, phi_k)                                   # z_i, Eq. (19), compensated
    out[...] = readout(phi_q[..., None, :], State(S, z), eps)[..., 0, :]


def _initial(phi_k, v):
    xp = array_module(v)
    return zero_state(v.shape[:-2], phi_k.shape[-1], v.shape[-1], v.dtype, xp)


def attend(phi_q, phi_k, v, *, causal, eps, chunk_size=None, key_mask=None,
           initial_state=None, return_state=False):
    """Scan ``step`` over positions (causal), or accumulate the whole state, then read every
    query out (non-causal). Shapes (..., N, F), (..., N, M) -> (..., N, M). O(N F M) time,
    O(F M) memory beyond the output. ``chunk_size`` is ignored.

    A padded key (``key_mask`` False) leaves the state as it was; the scan starts from
    ``initial_state`` (zero when None) and, with ``return_state``, returns ``(out, State)``
    with the state after the last position.
    """
    xp = array_module(v)
    phi_k, v = drop_padded(phi_k, v, key_mask)
    state = _initial(phi_k, v) if initial_state is None else State(*initial_state)
    if not causal:
        for i in range(v.shape[-2]):
            state = update(state, phi_k[..., i, :], v[..., i, :])
        out = readout(phi_q, state, eps)
    else:
        out = xp.empty((*phi_q.shape[:-1], v.shape[-1]), dtype=v.dtype)
        for i in range(v.shape[-2]):
            out[..., i, :], state = step(phi_q[..., i, :], phi_k[..., i, :], v[..., i, :],
                                         state, eps)
    return (out, state) if return_state else out


def _readout_backward(dout, phi_q, state, eps):
    """Gradients of ``readout``: (dphi_q, dnum, dden) for queries (..., N, F).

    den = phi_q^T z + eps, out = phi_q^T S / den; dnum = dout / den,
    dden = -dout . out / den, dphi_q = S dnum + z dden (Eq. 13 with the normaliser).
    """
    den = phi_q @ state.z[..., :, None] + eps                       # (..., N, 1)
    dnum = dout / den                                               # (..., N, M)
    dden = -(dout * (phi_q @ state.S)).sum(axis=-1, keepdims=True) / den**2
    dphi_q = dnum @ state.S.swapaxes(-1, -2) + dden * state.z[..., None, :]
    return dphi_q, dnum, dden


def attend_backward(dout, phi_q, phi_k, v, *, causal, eps, chunk_size=None, key_mask=None,
                    initial_state=None, dstate=None):
    """Backpropagation through the scan, in O(F M) memory: (dphi_q, dphi_k, dv), and
    State(dS0, dz0) when ``initial_state`` is given.

    Forward in time, the state (S_i, z_i), from (S0, z0), gives each query's gradient (Eq. 13
    with the normaliser, see ``_readout_backward``). Backward in time, the adjoint state
    dS_i = dS + sum_{j >= i} phi_q_j dnum_j^T, dz_i = dz + sum_{j >= i} phi_q_j dden_j, which
    starts from the final state's gradient ``dstate`` = (dS, dz) (zero when None), gives the
    keys' and values' gradients: dphi_k_i = dS_i v_i + dz_i, dv_i = dS_i^T phi_k_i (Eq.
    14-15); after position 1 it is the initial state's gradient. Non-causal, every readout
    sees the final state and every key every query: the sums run over all positions at once.
    Padded keys' and values' gradients are 0.
    """
    xp = array_module(v)
    n = v.shape[-2]
    phi_k, v = drop_padded(phi_k, v, key_mask)
    start = _initial(phi_k, v) if initial_state is None else State(*initial_state)
    state = start
    if not causal:
        for i in range(n):
            state = update(state, phi_k[..., i, :], v[..., i, :])
        dphi_q, dnum, dden = _readout_backward(dout, phi_q, state, eps)
        ds = phi_q.swapaxes(-1, -2) @ dnum                           # (..., F, M)
        dz = (phi_q * dden).sum(axis=-2)                             # (..., F)
        grads = zero_padded(key_mask, v @ ds.swapaxes(-1, -2) + dz[..., None, :], phi_k @ ds)
        return (dphi_q, *grads)
    dphi_q, dnum = xp.empty_like(phi_q), xp.empty_like(v)
    dden = xp.empty((*v.shape[:-1], 1), dtype=v.dtype)
    for i in range(n):                                               # forward in time
        state = update(state, phi_k[..., i, :], v[..., i, :])
        grads = _readout_backward(dout[..., i:i + 1, :], phi_q[..., i:i + 1, :], state, eps)
        dphi_q[..., i:i + 1, :], dnum[..., i:i + 1, :], dden[..., i:i + 1, :] = grads
    adjoint = _initial(phi_k, v) if dstate is None else State(*dstate)
    dphi_k, dv = xp.empty_like(phi_k), xp.empty_like(v)
    for i in reversed(range(n)):                                     # backward in time
        adjoint = State(adjoint.S + phi_q[..., i, :, None] * dnum[..., i, None, :],
                        adjoint.z + phi_q[..., i, :] * dden[..., i, :])
        dphi_k[..., i, :] = (adjoint.S @ v[..., i, :, None])[..., 0] + adjoint.z
        dv[..., i, :] = (phi_k[..., i, None, :] @ adjoint.S)[..., 0, :]
    dphi_k, dv = zero_padded(key_mask, dphi_k, dv)
    if initial_state is None:
        return dphi_q, dphi_k, dv
    return dphi_q, dphi_k, dv, adjoint           # the adjoint before position 1: d(S0, z0)
