"""Validation and dtype policy, owned in one place.

Every public function calls these once, before it dispatches to a kernel (``dispatch``), so
kernels may assume: floating arrays of one dtype (float32 or float64; float16 is computed in
float32), equal leading dimensions, matching N, D and M (Nq and Nk may differ only without a
causal mask), a valid eps, chunk size and state. Names of methods and backends are checked by
``dispatch``, which owns them.
"""
import math
import numbers
import sys

import numpy as np

def array_module(x):
    """numpy, or cupy when ``x`` is a CuPy array (cupy is never imported here)."""
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return cupy
    return np


def as_float_array(name, x):
    """``x`` as a float array, or a TypeError naming ``name`` and its dtype."""
    xp = array_module(x)
    x = xp.asarray(x)
    if x.dtype.kind != "f":
        raise TypeError(
            f"{name} must be a float16, float32 or float64 array, got dtype {x.dtype}"
        )
    return x


def common_dtype(*arrays):
    """The arrays' common dtype (the dtype results are returned in)."""
    first = arrays[0].dtype
    if all(a.dtype == first for a in arrays):
        return first  # the usual case; result_type costs microseconds, a lot for one step
    return np.result_type(*(a.dtype for a in arrays))


def compute_dtype(dtype):
    """The dtype the kernels run in for inputs of common ``dtype``: float16 runs in float32."""
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


def check_choice(kind, name, valid):
    """Return ``name`` if it is one of ``valid``, else a ValueError listing them."""
    if not isinstance(name, str) or name not in valid:
        raise ValueError(f"unknown {kind} {name!r}; valid names are {', '.join(valid)}")
    return name


def check_qkv(q, k, v, dout=None, *, causal=False):
    """Validate attention inputs q (..., Nq, D), k (..., Nk, D), v (..., Nk, M) and dout
    (..., Nq, M). Without ``causal``, Nq and Nk may differ (cross-attention); causal attention
    needs Nq == Nk.

    Returns
    -------
    arrays : tuple of ndarray
        q, k, v (and dout if given), cast to the compute dtype.
    out_dtype : numpy.dtype
        The dtype results are returned in (the inputs' common dtype).
    """
    check_flag("causal", causal)
    names = ("q", "k", "v", "dout")[: 3 if dout is None else 4]
    raw = (q, k, v) if dout is None else (q, k, v, dout)
    arrays = [as_float_array(n, a) for n, a in zip(names, raw)]
    modules = {array_module(a).__name__ for a in arrays}
    if len(modules) > 1:
        raise TypeError(f"q, k, v must all be NumPy or all CuPy arrays, got {sorted(modules)}")
    shapes = ", ".join(f"{n}{a.shape}" for n, a in zip(names, arrays))
    if any(a.ndim < 2 for a in arrays):
        raise ValueError(f"q, k, v need shape (..., N, D) or (..., N, M), got {shapes}")
    q, k, v = arrays[:3]
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(f"q, k and v must have the same leading dimensions: {shapes}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same length Nk: {shapes}")
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal attention needs queries and keys of one length N "
                         f"(Nq == Nk); different lengths are cross-attention, which has no "
                         f"causal mask: {shapes}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same width D: {shapes}")
    if q.shape[-1] == 0:
        raise ValueError(f"q and k need at least one feature (D >= 1): {shapes}")
    if dout is not None and arrays[3].shape != (*q.shape[:-1], v.shape[-1]):
        raise ValueError(f"dout must have the output's shape (..., Nq, M): {shapes}")
    return _in_compute_dtype(tuple(arrays))


def check_keys(q, k):
    """Softmax over no keys is 0 / 0: a ValueError when there are queries but no keys."""
    if k.shape[-2] == 0 and q.shape[-2] > 0:
        raise ValueError(f"softmax attention needs at least one key (Nk >= 1) for "
                         f"{q.shape[-2]} queries, got k{k.shape}")


def check_eps(eps):
    """``eps`` if it is a non-negative real number, else a ValueError."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not eps >= 0:
        raise ValueError(f"eps must be a non-negative number, got {eps!r}")
    return eps


def check_gating(causal, decay, log_gate, normalize):
    """``normalize`` as a bool; a ValueError when a decay or a log gate is asked of
    non-causal attention (the decay counts positions back from the query)."""
    normalize = check_flag("normalize", normalize)
    if not causal and (decay is not None or log_gate is not None):
        raise ValueError("decay and log_gate need causal=True: a decay multiplies the state "
                         "once per position, from each key to the query after it")
    return normalize


def check_decay(decay, lead, dtype, xp):
    """``decay`` (gamma) as an ``xp`` array of ``dtype`` whose shape broadcasts to ``lead``
    (the leading axes of q, e.g. (H,) for (B, H, N, D) inputs), each value in (0, 1]
    (NaN passes, to come out as NaN); None stays None."""
    if decay is None:
        return None
    decay = as_float_array("decay", decay if xp is not np else np.asarray(decay, float))
    try:
        ok = np.broadcast_shapes(decay.shape, lead) == tuple(lead)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"decay must be a float or an array whose shape broadcasts to the "
                         f"leading axes of q, {tuple(lead)}, got shape {decay.shape}")
    if decay.size and bool(((decay <= 0) | (decay > 1)).any()):
        raise ValueError(f"decay must lie in (0, 1] (gamma multiplies the state at each "
                         f"position), got values in [{float(decay.min())}, "
                         f"{float(decay.max())}]")
    return decay.astype(dtype, copy=False)


def check_log_gate(log_gate, shape, dtype, xp, name="log_gate"):
    """``log_gate`` as an ``xp`` array of ``dtype`` whose shape broadcasts to ``shape``
    ((..., N, F) for a sequence, (..., F) for a step; F the feature map's width), each value
    <= 0 and not -inf (NaN passes, to come out as NaN); None stays None."""
    if log_gate is None:
        return None
    log_gate = as_float_array(name, log_gate)
    try:
        ok = np.broadcast_shapes(log_gate.shape, shape) == tuple(shape)
    except ValueError:
        ok = False
    axes = "(..., N, F)" if name == "log_gate" else "(..., F)"
    if not ok or array_module(log_gate) is not xp:
        raise ValueError(f"{name} must be an {xp.__name__} array whose shape broadcasts to "
                         f"{axes} = {tuple(shape)}, F = {shape[-1]} the width of the feature "
                         f"map's output, got shape {log_gate.shape}")
    if log_gate.size and bool(((log_gate > 0) | (log_gate == -np.inf)).any()):
        raise ValueError(f"{name} must hold log gates: values <= 0 and finite (alpha = "
                         f"exp({name}) in (0, 1]), got values in [{float(log_gate.min())}, "
                         f"{float(log_gate.max())}]")
    return log_gate.astype(dtype, copy=False)


def check_chunk_size(chunk_size):
    """``chunk_size`` if it is None or a positive integer, else a ValueError."""
    if chunk_size is None:
        return None
    if (isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral)
            or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")
    return int(chunk_size)


def check_scale(scale, d):
    """The softmax scale as a float: 1 / sqrt(D) when None; a ValueError unless it is a
    finite real number."""
    if scale is None:
        return d ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number or None, got {scale!r}")
    return float(scale)


def check_step(q_t, k_t, v_t):
    """Validate one step's inputs: q_t, k_t (..., D), v_t (..., M), equal leading dims.
    Returns them in the compute dtype, and the dtype results are returned in."""
    steps = (as_float_array("q_t", q_t), as_float_array("k_t", k_t), as_float_array("v_t", v_t))
    q_t, k_t, v_t = steps
    if 0 in (q_t.ndim, k_t.ndim, v_t.ndim):
        raise ValueError(f"q_t, k_t need shape (..., D) and v_t (..., M), got {_shapes(steps)}")
    if q_t.shape != k_t.shape or q_t.shape[:-1] != v_t.shape[:-1]:
        raise ValueError(f"q_t and k_t must have one shape (..., D), v_t (..., M): "
                         f"{_shapes(steps)}")
    return _in_compute_dtype(steps)


def _in_compute_dtype(arrays):
    """(arrays cast to the compute dtype, the dtype results are returned in)."""
    out_dtype = common_dtype(*arrays)
    dtype = compute_dtype(out_dtype)
    if all(a.dtype == dtype for a in arrays):
        return arrays, out_dtype      # the usual case: a generation step is short, keep it cheap
    return tuple(a.astype(dtype, copy=False) for a in arrays), out_dtype


def _shapes(steps):
    """"q_t(...), k_t(...), v_t(...)": one step's shapes, for an error message."""
    return ", ".join(f"{n}{a.shape}" for n, a in zip(("q_t", "k_t", "v_t"), steps))


def check_state(state, s_shape, dtype, xp, compensated=False, name="state"):
    """The RNN ``state`` as (S, z) checked against S (..., F, M) = ``s_shape`` and z (..., F),
    cast to ``dtype``; None stays None (the caller starts from zeros, Eq. 16-17). With
    ``compensated`` the state is (S, z, S_c, z_c), a ``CompensatedState``: S_c like S, z_c
    like z. A plain state given to a compensated step, or the reverse, is a TypeError.
    Messages call it ``name``."""
    if state is None:
        return None
    names = ("S", "z", "S_c", "z_c") if compensated else ("S", "z")
    shapes = (s_shape, s_shape[:-1]) * (len(names) // 2)
    kind = "CompensatedState" if compensated else "State"
    expected = f"{kind}({', '.join(f'{n} {sh}' for n, sh in zip(names, shapes))})"
    if not (isinstance(state, tuple) and len(state) == len(names)):
        hint = ""
        if isinstance(state, tuple) and len(state) == 4:
            hint = ("; a CompensatedState (4 arrays) carries Kahan's compensation: pass "
                    "compensated=True to continue it")
        elif isinstance(state, tuple) and len(state) == 2 and compensated:
            hint = ("; a plain State has no compensation terms: start from None, or from "
                    "CompensatedState(S, z, zeros_like(S), zeros_like(z))")
        raise TypeError(f"{name} must be None or {expected}, got {type(state).__name__}"
                        f"{f' of {len(state)} arrays' if isinstance(state, tuple) else ''}"
                        f"{hint}")
    arrays = [as_float_array(f"{name}.{n}", a) for n, a in zip(names, state)]
    if any(array_module(a) is not xp for a in arrays):
        raise TypeError(f"{name} must hold {xp.__name__} arrays like q_t, k_t and v_t, got "
                        f"{', '.join(type(a).__name__ for a in arrays)}")
    if any(a.shape != shape for a, shape in zip(arrays, shapes)):
        got = ", ".join(f"{n} {a.shape}" for n, a in zip(names, arrays))
        lead, state_lead = s_shape[:-2], arrays[0].shape[:-2]
        hint = ""
        if len(lead) == len(state_lead) + 1 and lead[:-1] == state_lead:
            hint = (f"; q_t, k_t and v_t have one leading axis more than the state, as a "
                    f"whole sequence (..., N, D) would: a step takes one position, shape "
                    f"(..., D) with the state's leading axes {state_lead}; step through the "
                    f"positions one at a time, or call linear_attention(..., causal=True)")
        raise ValueError(f"{name} must be {expected} for these inputs and feature map, got "
                         f"{got}{hint}")
    return tuple(a.astype(dtype, copy=False) for a in arrays)


def rows(x):
    """(..., N, W) -> (R, N, W), C-contiguous, R = the product of the leading axes: the layout
    every compiled kernel takes (batch x heads flattened). NumPy or CuPy."""
    return array_module(x).ascontiguousarray(x.reshape(math.prod(x.shape[:-2]), *x.shape[-2:]))


# --- LSH (Reformer) attention ------------------------------------------------------------

def check_count(name, value, smallest):
    """``value`` as an int if it is an integer >= ``smallest`` (Python or NumPy; a bool or a
    float, even 2.0, is a TypeError), else a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < smallest:
        raise ValueError(f"{name} must be at least {smallest}, got {value}")
    return int(value)


def check_lsh(qk, v=None, dout=None, *, n_hashes, chunk_size, n_buckets, causal, seed):
    """Validate LSH attention inputs: qk (..., N, D), v and dout (..., N, M) (v and dout
    optional, for the mask), and its options: n_hashes >= 1, chunk_size >= 1, n_buckets
    None or even >= 2, seed >= 0 integers, causal a bool (the backend: ``dispatch``).

    Returns
    -------
    arrays : tuple of ndarray
        qk (and v, dout if given), cast to the compute dtype.
    out_dtype : numpy.dtype
        The dtype results are returned in (the inputs' common dtype).
    """
    named = [(n, a) for n, a in (("qk", qk), ("v", v), ("dout", dout)) if a is not None]
    arrays = [as_float_array(n, a) for n, a in named]
    if any(array_module(a) is not np for a in arrays):
        raise TypeError("LSH attention runs on NumPy arrays only: it has no CUDA kernel")
    shapes = ", ".join(f"{n}{a.shape}" for (n, _), a in zip(named, arrays))
    if any(a.ndim < 2 for a in arrays):
        raise ValueError(f"qk needs shape (..., N, D), v and dout (..., N, M), got {shapes}")
    if len(arrays) > 1 and arrays[1].shape[:-1] != arrays[0].shape[:-1]:
        raise ValueError(f"qk and v must have the same leading dimensions and N: {shapes}")
    if len(arrays) > 2 and arrays[2].shape != arrays[1].shape:
        raise ValueError(f"dout must have the output's shape (..., N, M): {shapes}")
    if arrays[0].shape[-1] == 0:
        raise ValueError(f"qk needs at least one feature (D >= 1): {shapes}")
    check_count("n_hashes", n_hashes, 1)
    check_count("chunk_size", chunk_size, 1)
    if n_buckets is not None and check_count("n_buckets", n_buckets, 2) % 2:
        raise ValueError(f"n_buckets must be even (the hash takes the argmax of [xR, -xR]), "
                         f"got {n_buckets}")
    check_count("seed", seed, 0)
    check_flag("causal", causal)
    return _in_compute_dtype(tuple(arrays))


# --- the stateful RNN (linattn.Recurrence) ----------------------------------------------------

def check_flag(name, value):
    """``value`` as a bool if it is one (Python or NumPy), else a TypeError naming ``name``."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def backend_array_module(backend):
    """The array module a constructor without arrays works in for ``backend``: cupy for
    "cupy" when it imports, else numpy (``dispatch.kernel`` then says clearly what "cupy"
    lacks: CuPy, a GPU)."""
    if backend == "cupy":
        try:
            import cupy
        except ImportError:
            return np
        return cupy
    return np


def check_recurrence(lead_shape, d, m, dtype):
    """The sizes and dtype of a ``Recurrence``: lead_shape a tuple of integers >= 0 (the batch
    and head axes, () for one sequence), d >= 1, m >= 0, dtype float32 or float64.
    Returns (lead_shape as a tuple of ints, d, m, numpy.dtype)."""
    if not isinstance(lead_shape, (tuple, list)):
        raise TypeError(f"lead_shape must be a tuple of integers (() for a single sequence), "
                        f"got {lead_shape!r}")
    lead = tuple(check_count("lead_shape entry", n, 0) for n in lead_shape)
    d, m = check_count("d", d, 1), check_count("m", m, 0)
    try:
        dtype = np.dtype(dtype)
    except TypeError as err:
        raise TypeError(f"dtype must be float32 or float64, got {dtype!r}") from err
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"dtype must be float32 or float64 (the state's dtype; "
                        f"linear_attention_step computes float16 inputs in float32), got "
                        f"{dtype}")
    return lead, d, m, dtype


def check_recurrence_step(q_t, k_t, v_t, qk_shape, v_shape, dtype, xp):
    """One ``Recurrence.step``'s inputs against the shapes and dtype its constructor fixed:
    q_t, k_t ``qk_shape`` (..., D), v_t ``v_shape`` (..., M), all ``xp`` arrays of ``dtype``.
    Returns them as plain ``xp.ndarray`` (a subclass is viewed as its base class), or raises
    a TypeError (array type, dtype) or ValueError (shape) naming what differs."""
    arrays = []
    for name, x, shape in (("q_t", q_t, qk_shape), ("k_t", k_t, qk_shape), ("v_t", v_t, v_shape)):
        if not isinstance(x, xp.ndarray):
            raise TypeError(f"{name} must be a {xp.__name__}.ndarray (this Recurrence runs on "
                            f"{xp.__name__} arrays), got {type(x).__module__}."
                            f"{type(x).__name__}")
        if x.dtype != dtype:
            raise TypeError(f"{name} must have dtype {dtype} like this Recurrence's state, got "
                            f"{x.dtype}; convert it with {name}.astype({dtype.name})")
        if x.shape != shape:
            hint = ""
            if x.ndim == len(shape) + 1 and x.shape[:-2] + x.shape[-1:] == shape:
                hint = (f"; it looks like a whole sequence of {x.shape[-2]} positions: a step "
                        f"takes one position, so pass {name}[..., i, :] for i = 0, 1, ... in "
                        f"turn (or call linear_attention(..., causal=True) on the sequence)")
            raise ValueError(f"{name} must have shape {shape} (lead_shape + ({shape[-1]},)), "
                             f"got {x.shape}{hint}")
        arrays.append(xp.asarray(x))
    return tuple(arrays)


# --- key padding and handed-over states (linear_attention, softmax_attention) ---------------

def check_key_mask(key_mask, key_lengths, lead, n_k, xp):
    """The real keys as one boolean array of shape (*lead, Nk), or None when neither is given.

    ``key_mask``: booleans whose shape broadcasts to (*lead, Nk), True for a real key.
    ``key_lengths``: integers whose shape broadcasts to ``lead``, each in 0..Nk: the first
    ``length`` keys are real (right padding). Both are ``xp`` arrays (or, for NumPy, anything
    ``numpy.asarray`` takes): no hidden host-device copies."""
    if key_mask is not None and key_lengths is not None:
        raise ValueError("pass key_mask or key_lengths, not both (key_lengths=L is "
                         "key_mask = arange(Nk) < L[..., None])")
    if key_mask is None and key_lengths is None:
        return None
    name, given = ("key_mask", key_mask) if key_mask is not None else ("key_lengths", key_lengths)
    if xp is np:
        given = np.asarray(given)
    elif not isinstance(given, xp.ndarray):
        raise TypeError(f"{name} must be a {xp.__name__} array like q, k and v, got "
                        f"{type(given).__module__}.{type(given).__name__}")
    want = (*lead, n_k) if name == "key_mask" else lead
    try:
        shape = np.broadcast_shapes(given.shape, want)
    except ValueError:
        shape = None
    if shape != want:
        raise ValueError(f"{name} must have a shape that broadcasts to {want} "
                         f"({'(..., Nk)' if name == 'key_mask' else 'the leading axes'} of "
                         f"k), got {given.shape}")
    if name == "key_mask":
        if given.dtype != bool:
            raise TypeError(f"key_mask must be a boolean array (True for a real key), got "
                            f"dtype {given.dtype}")
        return xp.broadcast_to(given, want)
    if given.dtype.kind not in "iu":
        raise TypeError(f"key_lengths must be an integer array, got dtype {given.dtype}")
    if given.size and (int(given.min()) < 0 or int(given.max()) > n_k):
        raise ValueError(f"key_lengths must lie in 0..Nk = 0..{n_k}, got values in "
                         f"[{int(given.min())}, {int(given.max())}]")
    return xp.arange(n_k) < xp.broadcast_to(given, want)[..., None]


def check_states(causal, initial_state, return_state):
    """``return_state`` as a bool; a ValueError when a state is asked of non-causal
    attention, where no position comes before another to hand a state over."""
    return_state = check_flag("return_state", return_state)
    if not causal and (initial_state is not None or return_state):
        raise ValueError("initial_state, return_state and dstate need causal=True: a state carries "
                         "the keys before a position over to the next piece of a sequence")
    return return_state


# --- the delta rule (linattn.delta) -----------------------------------------------------------

def check_numpy_only(family, *arrays):
    """A TypeError when any of ``arrays`` is a CuPy array: ``family`` runs on NumPy only."""
    if any(array_module(a) is not np for a in arrays):
        raise TypeError(f"{family} runs on NumPy arrays only: it has no CUDA kernel; move the "
                        f"arrays to the host with cupy.asnumpy(x)")


def check_beta(beta, shape, dtype, name="beta"):
    """The write strengths ``beta`` as a float array of ``shape`` (..., N) in ``dtype``.

    Each finite value must lie in [0, 2]: with a unit key k the update multiplies the memory
    by I - beta k k^T, whose eigenvalue along k is 1 - beta, of size at most 1 only there.
    NaN and inf are passed on (NaN in gives NaN out, as everywhere)."""
    beta = as_float_array(name, beta)
    check_numpy_only("the delta rule", beta)
    if beta.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} (one strength per position, "
                         f"the leading axes and N of q), got {beta.shape}")
    finite = beta[np.isfinite(beta)]
    if finite.size and (finite.min() < 0 or finite.max() > 2):
        raise ValueError(f"{name} must lie in [0, 2] (usually (0, 1), a sigmoid): outside it "
                         f"the update I - beta k k^T is no longer a contraction; got values in "
                         f"[{finite.min()}, {finite.max()}]")
    return beta.astype(dtype, copy=False)


def check_memory(state, shape, dtype, name="initial_state"):
    """The delta rule's memory S as a float array of ``shape`` (..., F, M) in ``dtype``;
    None stays None (zero memory)."""
    if state is None:
        return None
    if isinstance(state, tuple):
        raise TypeError(f"{name} of the delta rule is one array S (..., F, M), not a tuple "
                        f"like linear attention's State (S, z): the delta rule has no "
                        f"normaliser z")
    state = as_float_array(name, state)
    check_numpy_only("the delta rule", state)
    if state.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} (..., F, M) for these inputs "
                         f"and feature map, got {state.shape}")
    return state.astype(dtype, copy=False)
