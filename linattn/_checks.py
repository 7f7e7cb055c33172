"""Validation and dtype policy, owned in one place.

Every public function calls these once, before it dispatches to a kernel, so kernels may
assume: floating arrays of one dtype (float32 or float64; float16 is computed in float32),
equal leading dimensions, matching N, D and M, and a known method, backend and feature map.
"""
import sys

import numpy as np

METHODS = ("auto", "quadratic", "linear", "chunked", "recurrent")
BACKENDS = ("auto", "numpy", "numba", "cupy")


def array_module(x):
    """numpy, or cupy when ``x`` is a CuPy array (cupy is never imported here)."""
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return cupy
    return np


def resolve_backend(backend, xp):
    """"numba" or "numpy": the CPU backend that runs ``backend`` (a valid name) for arrays
    of module ``xp``, once ``cuda.launch.wants_cupy`` has decided the call stays off the GPU.

    "auto" is "numba" for NumPy arrays when numba imports, else "numpy" (the NumPy forms also
    run on CuPy arrays through ``xp``). Numba is imported here, on first use, not by
    ``import linattn``, which it would slow down by about 0.3 s.
    """
    if backend == "auto":
        return "numba" if xp is np and _numba_imports() else "numpy"
    if backend == "numba" and xp is not np:
        raise TypeError("backend 'numba' runs on NumPy arrays; CuPy arrays need 'cupy' or 'auto'")
    if backend == "numba" and not _numba_imports():
        raise ValueError("backend 'numba' needs the numba package; install it or use 'numpy'")
    return backend


def _numba_imports():
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


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


def check_qkv(q, k, v, dout=None):
    """Validate attention inputs of shape q, k (..., N, D), v and dout (..., N, M).

    Returns
    -------
    arrays : tuple of ndarray
        q, k, v (and dout if given), cast to the compute dtype.
    out_dtype : numpy.dtype
        The dtype results are returned in (the inputs' common dtype).
    """
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
    if not (q.shape[:-1] == k.shape[:-1] and q.shape[:-2] == v.shape[:-2]
            and q.shape[-2] == v.shape[-2]):
        raise ValueError(f"leading dimensions and N must match: {shapes}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same width D: {shapes}")
    if q.shape[-1] == 0:
        raise ValueError(f"q and k need at least one feature (D >= 1): {shapes}")
    if dout is not None and arrays[3].shape != v.shape:
        raise ValueError(f"dout must have the output's shape (..., N, M): {shapes}")
    return _in_compute_dtype(tuple(arrays))


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
        return arrays, out_dtype      # the usual case, and a generation step is ~15 us in all
    return tuple(a.astype(dtype, copy=False) for a in arrays), out_dtype


def _shapes(steps):
    """"q_t(...), k_t(...), v_t(...)": one step's shapes, for an error message."""
    return ", ".join(f"{n}{a.shape}" for n, a in zip(("q_t", "k_t", "v_t"), steps))


# --- CTC and the speech experiment (linattn.model.ctc) -------------------------------------

def int_vector(name, x, size):
    """``x`` as an int64 vector of ``size`` entries, or a clear error."""
    x = np.asarray(x)
    if x.dtype.kind not in "iu" or x.shape != (size,):
        raise ValueError(f"{name} must be an integer array of shape ({size},), got "
                         f"{x.dtype} {x.shape}")
    return x.astype(np.int64)


def check_ctc(logits, input_lengths, labels, label_lengths, blank):
    """Validate the inputs of ``ctc_loss``: logits (B, T, C) float, input_lengths (B,) in
    1..T, labels (B, L_max) integers, label_lengths (B,) in 0..L_max, every counted label in
    0..C-1 and not ``blank``, blank in 0..C-1.

    Returns (logits, input_lengths, labels, label_lengths), the integers as int64.
    """
    logits = as_float_array("logits", logits)
    if array_module(logits) is not np:
        raise TypeError("ctc_loss runs on NumPy arrays")
    if logits.ndim != 3 or 0 in logits.shape:
        raise ValueError(f"logits must have shape (B, T, C) with B, T, C >= 1, got "
                         f"{logits.shape}")
    b, t, c = logits.shape
    if isinstance(blank, bool) or not isinstance(blank, (int, np.integer)) or not 0 <= blank < c:
        raise ValueError(f"blank must be a class index in 0..{c - 1}, got {blank!r}")
    input_lengths = int_vector("input_lengths", input_lengths, b)
    if np.any(input_lengths < 1) or np.any(input_lengths > t):
        raise ValueError(f"input_lengths must lie in 1..T = {t}, got {input_lengths}")
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu" or labels.ndim != 2 or labels.shape[0] != b:
        raise ValueError(f"labels must be an integer array of shape (B, L_max) = ({b}, ...), "
                         f"got {labels.dtype} {labels.shape}")
    labels = labels.astype(np.int64)
    label_lengths = int_vector("label_lengths", label_lengths, b)
    if np.any(label_lengths < 0) or np.any(label_lengths > labels.shape[1]):
        raise ValueError(f"label_lengths must lie in 0..L_max = {labels.shape[1]}, got "
                         f"{label_lengths}")
    counted = labels[np.arange(labels.shape[1]) < label_lengths[:, None]]
    if counted.size and (counted.min() < 0 or counted.max() >= c or np.any(counted == blank)):
        raise ValueError(f"labels must be classes in 0..{c - 1} other than the blank "
                         f"({blank}), got values in [{counted.min()}, {counted.max()}]"
                         f"{' including the blank' if np.any(counted == blank) else ''}")
    return logits, input_lengths, labels, label_lengths
