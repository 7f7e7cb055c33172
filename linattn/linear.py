"""Linear attention, the public functions: section 3 of Katharopoulos et al. (2020),
"Transformers are RNNs", arXiv:2006.16236.

    out_i = phi(q_i)^T S / (phi(q_i)^T z + eps),  S = sum_j phi(k_j) v_j^T,  z = sum_j phi(k_j)

with j over all positions (Eq. 5), or j <= i when causal (Eq. 9-12). Every function checks
its inputs once (``_checks``), applies the feature map (unless the kernel fuses it), and
hands positive features to the kernel pair ``dispatch`` picks for ``method`` and ``backend``.
Oracle: ``method="quadratic"``, ``backend="numpy"``.
"""
from . import _checks, _gates, dispatch
from .feature_maps import get_feature_map
from .forms.recurrent import CompensatedState, State, zero_state


def _options(causal, eps, chunk_size):
    """The keywords every kernel takes, checked; ``chunk_size`` only when given, so that
    each kernel keeps its own measured default."""
    kw = dict(causal=causal, eps=_checks.check_eps(eps))
    if _checks.check_chunk_size(chunk_size) is not None:
        kw["chunk_size"] = chunk_size
    return kw


def linear_attention(q, k, v, *, causal=False, feature_map="elu+1", eps=1e-6,
                     method="auto", backend="auto", chunk_size=None, key_mask=None,
                     key_lengths=None, initial_state=None, return_state=False, decay=None,
                     log_gate=None, normalize=True):
    """Linear attention, Eq. (5) (non-causal) or Eq. (9)-(12) (causal).

    out_i = phi(q_i)^T S_i / (phi(q_i)^T z_i + eps), S_i = sum_j phi(k_j) v_j^T and
    z_i = sum_j phi(k_j), over all j, or j <= i if ``causal``.

    Parameters
    ----------
    q : ndarray, shape (..., Nq, D)
    k : ndarray, shape (..., Nk, D)
    v : ndarray, shape (..., Nk, M)
        Leading axes (batch, heads, ...) must be equal, and may be absent. Without a mask,
        Nq and Nk may differ (cross-attention); causal attention needs Nq == Nk = N.
    causal : bool
        Position i attends only to positions j <= i.
    feature_map : {"elu+1", "relu", "taylor", "favor"} or object
        phi; an object needs ``forward(x)`` and ``vjp(x, dphi)`` (see ``feature_maps``).
    eps : float
        Added to the normaliser phi(q_i)^T z_i.
    method : {"auto", "quadratic", "linear", "chunked", "recurrent"}
        The algorithm; all compute the same function. "quadratic" builds the N x N matrix
        (the oracle), "linear" uses running sums, "chunked" blocks of ``chunk_size``
        positions, "recurrent" scans ``linear_attention_step``. "auto" picks the fastest.
    backend : {"auto", "numpy", "numba", "cupy"}
        "cupy" runs CUDA kernels on CuPy arrays ("chunked" and "auto": the chunked scan;
        "linear" and "recurrent": one thread per column). "numba" runs compiled code on all
        cores ("linear", "recurrent": the running sums as loops; "chunked" and "auto": blocks
        of BLAS matrix products, elu+1 fused). "auto" is "cupy" for CuPy arrays, else
        "numba" when numba imports, else "numpy"; a method Numba lacks runs on NumPy.
    chunk_size : int or None
        Block length of ``method="chunked"`` (and of Numba's "auto"). None: each backend's
        measured best at D = M = 64: for Numba 16, or 32 where SciPy's OpenBLAS runs its
        Haswell kernel or Zen's, whose products are Haswell's
        (``numba_cpu.chunked.default_chunk_size``); 32 for NumPy (within 5% of 64).
    key_mask : ndarray of bool, shape broadcasting to (..., Nk), optional
        True for a real key, False for padding: a batch of sequences of different lengths in
        one call. A padded key adds nothing to any sum (numerator and normaliser): phi(k_j)
        and v_j are taken as 0 after the feature map, whatever they hold (NaN included), so
        a causal state passes a padded position unchanged and a sequence padded on the left
        or the right gets, at its real positions, what it gets alone. A query whose keys are
        all padded gets 0 / (0 + eps) = 0. Causal or not, cross-attention included.
    key_lengths : ndarray of int, shape broadcasting to the leading axes, optional
        The number of real keys of each sequence, padded on the right: the same as
        ``key_mask = arange(Nk) < key_lengths[..., None]``. Give one of the two.
    initial_state : State, optional
        (S0 (..., F, M), z0 (..., F)), the state after earlier positions, e.g. one that
        ``return_state`` or ``Recurrence.state`` gave: every readout adds phi(q_i)^T S0 to its
        numerator and phi(q_i)^T z0 to its normaliser, so a long sequence can be processed
        in pieces. Causal only.
    return_state : bool
        Also return the state after the last position (padded keys not counted), to hand
        to the next piece, ``linear_attention_step`` or ``Recurrence``. Causal only.
    decay : float or ndarray, shape broadcasting to q.shape[:-2], optional
        gamma in (0, 1], e.g. one per head ((H,) for (B, H, N, D) inputs): the state decays
        before each update, S_i = gamma S_{i-1} + phi(k_i) v_i^T and z_i likewise, so
        A_ij = gamma^(i - j) phi(q_i)^T phi(k_j) for j <= i: the decay of RetNet (Sun et al.
        2023) and the scalar transition of Mamba-2 (Dao and Gu 2024). Causal only; None is
        the paper's sums (gamma = 1), computed by the code above unchanged.
    log_gate : ndarray, shape broadcasting to (..., N, F), optional
        GLA's gate (Yang et al. 2023) in log space, g_i <= 0, finite, per position and
        feature (F the feature map's width): S_i = diag(exp(g_i)) S_{i-1} + phi(k_i) v_i^T,
        z_i = exp(g_i) * z_{i-1} + phi(k_i). With ``decay`` too, the two multiply (log gamma
        is added to g). Causal only. See ``forms.decay`` for the forms and their derivation.
    normalize : bool
        False drops the normaliser, as RetNet does: out_i = phi(q_i)^T S_i (no z, no eps),
        with or without a decay or gate; causal or not (non-causal: phi(q_i)^T sum_j
        phi(k_j) v_j^T over all j).

    Returns
    -------
    out : ndarray, shape (..., Nq, M), in the inputs' dtype (float16 is computed in float32).
    state : State
        Only with ``return_state``: S (..., F, M), z (..., F), in the compute dtype.

    Key masks and states run on every method of the NumPy and Numba backends (Numba's fused
    elu+1 included), and on CuPy arrays in the causal chunked kernels, elsewhere through
    NumPy's forms: "auto" keeps the backend and method it would pick without them. A decay,
    a log gate and ``normalize=False`` run on NumPy's forms ("quadratic": the decayed kernel
    matrix, the oracle; "linear" and "recurrent": the gated running sums; "chunked" (and
    "auto" when causal): blocks in log space, finite in float32 for any N and decay) and on
    Numba's "linear" and
    "recurrent" (compiled gated loops), which method "auto" picks on Numba for them
    (``dispatch.GATED``). ``backend="numba"`` with another method is a ValueError naming the
    option (``backend="auto"`` then runs NumPy's form), and so are CuPy arrays with
    ``backend="cupy"`` or ``"auto"``.

    Cost: O(N F M) time and O(N (F + M)) memory for every method but "quadratic"
    (O(N^2 max(F, M)) time, O(N^2) memory); F is the feature map's width.
    """
    (q, k, v), out_dtype = _checks.check_qkv(q, k, v, causal=causal)
    return_state = _checks.check_states(causal, initial_state, return_state)
    normalize = _checks.check_gating(causal, decay, log_gate, normalize)
    mask = _checks.check_key_mask(key_mask, key_lengths, q.shape[:-2], k.shape[-2],
                                  _checks.array_module(q))
    needs = dispatch.needed(causal=causal, key_mask=mask, initial_state=initial_state,
                            return_state=return_state, decay=decay, log_gate=log_gate,
                            unnormalized=not normalize)
    kernel, x_q, x_k, kw = _prepare(q, k, v, causal, feature_map, eps, method, backend,
                                    chunk_size, needs)
    kw.update(dispatch.given(key_mask=mask, return_state=return_state,
                             initial_state=_state("initial_state", initial_state, x_q, v)))
    kw.update(_gates.sequence_gate(decay, log_gate, normalize, x_q)[0])
    out = kernel.attend(x_q, x_k, v, **kw)
    if return_state:
        out, state = out
        return out.astype(out_dtype, copy=False), state
    return out.astype(out_dtype, copy=False)


def _prepare(q, k, v, causal, feature_map, eps, method, backend, chunk_size, needs):
    """(kernel, phi(q) or q, phi(k) or k, keywords): the kernel for the call, the features it
    takes (the raw q and k when it fuses the map, with ``elu=True`` among the keywords)."""
    kw = _options(causal, eps, chunk_size)
    phi = get_feature_map(feature_map)
    kernel, _ = dispatch.kernel("linear", method, backend, _checks.array_module(q), causal,
                                q.shape[-2:], needs=needs)
    if dispatch.fuses(kernel, phi):
        return kernel, q, k, dict(kw, elu=True)
    return kernel, phi.forward(q), phi.forward(k), kw


def _state(name, state, x_q, v):
    """``state`` checked against S (..., F, M), z (..., F) for features ``x_q`` (..., N, F) and
    values v (..., N, M), as a State in their dtype; None stays None."""
    xp = _checks.array_module(v)
    f = x_q.shape[-1]                     # a fused map (elu+1) keeps the width: F = D
    checked = _checks.check_state(state, (*v.shape[:-2], f, v.shape[-1]), v.dtype, xp,
                                  name=name)
    return None if checked is None else State(*checked)


def linear_attention_backward(dout, q, k, v, *, causal=False, feature_map="elu+1", eps=1e-6,
                              method="auto", backend="auto",
                              chunk_size=None, key_mask=None, key_lengths=None,
                              initial_state=None, dstate=None, decay=None, log_gate=None,
                              normalize=True):
    """Gradients of ``linear_attention`` with respect to q, k and v, Eq. (13)-(15), and to
    the initial state when one is given.

    The kernel returns the gradients with respect to the features and v (Eq. 13-15,
    extended to the normaliser); the feature map's vector-Jacobian product carries them back
    to q and k. Causal methods other than "quadratic" recompute the running state instead
    of storing it (section 3.3.1): O(N (F + M)) memory.

    With a state handed over, out_i reads S0 + S_i and z0 + z_i, and the final state is
    (S0 + S_N, z0 + z_N), so dS0 = sum_i phi(q_i) dnum_i^T + dS and dz0 = sum_i phi(q_i)
    dden_i + dz, with dnum_i = dout_i / den_i, dden_i = -dout_i . out_i / den_i and (dS, dz)
    = ``dstate``. Pieces of one sequence, processed in order forward and in reverse order
    backward, each handing its dS0 to the previous piece as ``dstate``, give the gradients
    of one pass exactly.

    Parameters
    ----------
    dout : ndarray, shape (..., Nq, M)
        Gradient of the loss with respect to the output.
    q, k, v and keywords
        As given to ``linear_attention`` (``return_state`` aside).
    dstate : State, optional
        (dS (..., F, M), dz (..., F)): the gradient of the loss with respect to the final
        state that ``return_state`` returned; None when the loss does not use it. Causal only.
    decay, log_gate, normalize
        As given to ``linear_attention``.

    Returns
    -------
    In this order, each of the last three only when its input is given:
    dq : ndarray, shape (..., Nq, D)
    dk : ndarray, shape (..., Nk, D)
        Exactly 0 at padded keys.
    dv : ndarray, shape (..., Nk, M)
        Exactly 0 at padded keys.
    dlog_gate : ndarray, log_gate's shape
        Only when ``log_gate`` is given; 0 at padded keys. With b_i = g_1 + ... + g_i,
        db_i = phi(q_i) * dphi(q_i) - phi(k_i) * dphi(k_i) (+ S_N * dS_N at i = N) and
        dg_l = sum_{i >= l} db_i (see ``forms.decay``).
    ddecay : ndarray, decay's shape (0-d for a float)
        Only when ``decay`` is given: sum over positions and features of dg / gamma.
    dinitial_state : State
        Only when ``initial_state`` is given: (dS0 (..., F, M), dz0 (..., F)), in the compute
        dtype.
    """
    (q, k, v, dout), out_dtype = _checks.check_qkv(q, k, v, dout, causal=causal)
    _checks.check_states(causal, initial_state, dstate is not None)
    normalize = _checks.check_gating(causal, decay, log_gate, normalize)
    xp = _checks.array_module(q)
    mask = _checks.check_key_mask(key_mask, key_lengths, q.shape[:-2], k.shape[-2], xp)
    needs = dispatch.needed(causal=causal, key_mask=mask, initial_state=initial_state,
                            return_state=dstate, decay=decay, log_gate=log_gate,
                            unnormalized=not normalize)
    kernel, x_q, x_k, kw = _prepare(q, k, v, causal, feature_map, eps, method, backend,
                                    chunk_size, needs)
    kw.update(dispatch.given(key_mask=mask,
                             initial_state=_state("initial_state", initial_state, x_q, v),
                             dstate=_state("dstate", dstate, x_q, v)))
    gating, decay, log_gate = _gates.sequence_gate(decay, log_gate, normalize, x_q)
    kw.update(gating)
    grads = kernel.attend_backward(dout, x_q, x_k, v, **kw)
    dq, dk, dv = grads[:3]
    extra = grads[3:]                     # dinitial_state, when given
    if "log_gate" in gating:              # the gate's gradient: to log_gate and to decay
        dg, extra = grads[3], grads[4:]
        dgates = () if log_gate is None else (_gates.reduce_to(dg, log_gate.shape),)
        if decay is not None:
            lead = x_q.shape[:-2]
            per_lead = dg.sum(axis=(-2, -1)) / xp.broadcast_to(decay, lead)  # d log gamma / gamma
            dgates += (_gates.reduce_to(per_lead, decay.shape),)
        extra = (*(g.astype(out_dtype, copy=False) for g in dgates), *extra)
    elif gating:                          # normalize=False alone: the gated forms, no gate
        extra = grads[4:]
    if "elu" not in kw:                   # gradients of the features: back through phi
        phi = get_feature_map(feature_map)
        dq, dk = phi.vjp(q, dq), phi.vjp(k, dk)
    if mask is not None:                  # exactly 0 even where padding holds inf or NaN
        dk = xp.where(mask[..., None], dk, dk.dtype.type(0))
    return (*(g.astype(out_dtype, copy=False) for g in (dq, dk, dv)), *extra)


def linear_attention_step(q_t, k_t, v_t, state=None, *, feature_map="elu+1", eps=1e-6,
                          backend="auto", compensated=False, decay=None, log_gate_t=None,
                          normalize=True):
    """One step of causal linear attention as an RNN, Eq. (16)-(20).

    S_t = S_{t-1} + phi(k_t) v_t^T, z_t = z_{t-1} + phi(k_t),
    out_t = phi(q_t)^T S_t / (phi(q_t)^T z_t + eps).
    Scanning it over positions 1..N gives causal ``linear_attention``. ``Recurrence`` takes
    the same step with the state kept in place, checked once: the faster way to generate.

    Parameters
    ----------
    q_t, k_t : ndarray, shape (..., D)
    v_t : ndarray, shape (..., M)
        One position of every sequence. The leading axes (batch, heads, ...) are the
        state's: with a state, q_t.shape[:-1] must equal S.shape[:-2], and an input with one
        axis more, as a whole sequence (..., N, D) has, is refused with a hint. Without a
        state any leading axes start new sequences, one per index: a sequence (B, N, D)
        would be read as B x N sequences of one token, so step through its positions, or
        call ``linear_attention(..., causal=True)`` for all of them at once.
    state : State, CompensatedState or None
        (S (..., F, M), z (..., F)) after the previous positions; None starts from zeros.
        With ``compensated``, a CompensatedState (S, z, S_c, z_c) as a compensated step
        returns it.
    feature_map, eps
        As for ``linear_attention``.
    backend : {"auto", "numpy", "numba", "cupy"}
        "cupy" (and "auto" with CuPy arrays) runs one fused kernel over all sequences at
        once; "numba" (and "auto" when numba imports) one compiled call, elu+1 included;
        "numpy" the NumPy step.
    compensated : bool
        Add S and z by Kahan's compensated summation (``forms.recurrent.kahan_add_``): a
        float32 state then stays within a few units of float32 rounding of the float64 one
        however many steps are taken (notebook 09 measures it), for a second pass over a
        state of the same size. The readout uses S and z as they are. Not with a decay, a
        log gate or ``normalize=False`` (a ValueError).
    decay : float or ndarray, shape broadcasting to q_t.shape[:-1], optional
        gamma in (0, 1]: S_t = gamma S_{t-1} + phi(k_t) v_t^T, z_t likewise.
    log_gate_t : ndarray, shape broadcasting to (..., F), optional
        This position's log gate g_t <= 0: S_t = diag(exp(g_t)) S_{t-1} + phi(k_t) v_t^T,
        z_t = exp(g_t) * z_{t-1} + phi(k_t); with ``decay`` too, the two multiply.
    normalize : bool
        False reads out phi(q_t)^T S_t alone (z is still carried). Decay, gate and
        normaliser as in ``linear_attention``, whose causal forms scanning this step gives.

    Returns
    -------
    out_t : ndarray, shape (..., M), in the inputs' dtype.
    state : State or CompensatedState
        The new state, in the compute dtype (float32 for float16 inputs); the one passed in
        is not modified.

    Cost: O(F M) time and memory per step, whatever the position.
    """
    (q_t, k_t, v_t), out_dtype = _checks.check_step(q_t, k_t, v_t)
    eps = _checks.check_eps(eps)
    compensated = _checks.check_flag("compensated", compensated)
    normalize = _checks.check_gating(True, decay, log_gate_t, normalize)
    gated = decay is not None or log_gate_t is not None or not normalize
    if gated and compensated:
        raise ValueError("compensated=True does not take a decay, log_gate_t or "
                         "normalize=False: Kahan's sums add, a decay also multiplies")
    phi = get_feature_map(feature_map)
    xp = _checks.array_module(q_t)
    needs = dispatch.needed(decay=decay, log_gate=log_gate_t, unnormalized=not normalize)
    kernel, _ = dispatch.kernel("step", "auto", backend, xp, needs=needs)
    fused = dispatch.fuses(kernel, phi)
    phi_q, phi_k = (q_t, k_t) if fused else (phi.forward(q_t), phi.forward(k_t))
    lead, f, m = q_t.shape[:-1], phi_k.shape[-1], v_t.shape[-1]
    state = _checks.check_state(state, (*lead, f, m), q_t.dtype, xp, compensated)
    elu = dict(elu=True) if fused else {}        # raw q_t and k_t: the kernel applies elu+1
    if compensated:              # a copy of the state, updated in place: the input is kept
        state = (zero_state(lead, f, m, q_t.dtype, xp, compensated=True) if state is None
                 else CompensatedState(*(a.copy() for a in state)))
        out = xp.empty(v_t.shape, dtype=v_t.dtype)
        kernel.step_into_compensated(phi_q, phi_k, v_t, *state, out, v_t.dtype.type(eps),
                                     **elu)
        return out.astype(out_dtype, copy=False), state
    state = zero_state(lead, f, m, q_t.dtype, xp) if state is None else State(*state)
    if gated:
        out, state = kernel.step(phi_q, phi_k, v_t, state, eps, normalize=normalize,
                                 log_gate=_gates.step_gate(decay, log_gate_t, phi_k))
        return out.astype(out_dtype, copy=False), state
    out, state = kernel.step(phi_q, phi_k, v_t, state, eps=eps, **elu)
    return out.astype(out_dtype, copy=False), state

