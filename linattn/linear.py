"""Linear attention, the public functions: section 3 of Katharopoulos et al. (2020),
"Transformers are RNNs", arXiv:2006.16236.

    out_i = phi(q_i)^T S / (phi(q_i)^T z + eps),  S = sum_j phi(k_j) v_j^T,  z = sum_j phi(k_j)

with j over all positions (Eq. 5), or j <= i when causal (Eq. 9-12). Every function checks
its inputs once (``_checks``), applies the feature map, and hands positive features to one
kernel pair chosen by ``method`` and ``backend`` in ``_kernel``, the single dispatch table.
Oracle: ``method="quadratic"``, ``backend="numpy"``.
"""
import numbers

from . import _checks
from .feature_maps import EluPlusOne, get_feature_map
from .cuda import chunked as cuda_chunked, cumulative as cuda_cumulative
from .cuda import launch as cuda_launch, step as cuda_step
from .forms import chunked, cumulative, quadratic, recurrent
from .forms.recurrent import State

_NUMPY_FORMS = {"quadratic": quadratic, "linear": cumulative, "chunked": chunked,
                "recurrent": recurrent}
# backend="cupy": v1 (one thread per column) for the running-sum methods, v2 (chunked scan)
# for "chunked"; "quadratic" is the NumPy oracle running on CuPy arrays.
_CUPY_FORMS = {"quadratic": quadratic, "linear": cuda_cumulative, "chunked": cuda_chunked,
               "recurrent": cuda_cumulative}


def _kernel(method, backend, causal, xp):
    """(module, backend): the module whose ``attend``/``attend_backward`` compute ``method``
    on ``backend``, and the name of the backend that runs, "auto" resolved.

    "cupy", or "auto" with CuPy arrays, runs the CUDA kernels; otherwise "auto" is Numba when
    it imports (``_checks.resolve_backend``). Numba runs "linear" and "recurrent" (the same
    compiled loops), "chunked" and its own "auto"; asked for "quadratic", "auto" runs NumPy.
    """
    _checks.check_choice("method", method, _checks.METHODS)
    _checks.check_choice("backend", backend, _checks.BACKENDS)
    numpy_method = ("chunked" if causal else "linear") if method == "auto" else method
    if cuda_launch.wants_cupy(backend, xp):     # "cupy", or "auto" with CuPy arrays
        return _CUPY_FORMS[numpy_method], "cupy"
    if _checks.resolve_backend(backend, xp) == "numba":
        from . import numba_cpu  # compiled kernels: imported on first use
        forms = numba_cpu.FORMS
        if method in forms:
            return forms[method], "numba"
        if backend == "numba":
            raise ValueError(f"method {method!r} has no numba kernel; numba runs "
                             f"{', '.join(forms)}; use backend='numpy' for {method!r}")
    return _NUMPY_FORMS[numpy_method], "numpy"


def _fused(backend, phi):
    """Whether the kernel applies ``phi`` itself: Numba fuses elu+1 (Eq. 7) into its passes."""
    return backend == "numba" and type(phi) is EluPlusOne


def _options(causal, eps, chunk_size):
    """The keywords every kernel takes, checked; ``chunk_size`` only when given, so that
    each kernel keeps its own measured default."""
    if not isinstance(eps, numbers.Real) or not eps >= 0:
        raise ValueError(f"eps must be a non-negative number, got {eps!r}")
    if chunk_size is None:
        return dict(causal=causal, eps=eps)
    if not isinstance(chunk_size, numbers.Integral) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")
    return dict(causal=causal, eps=eps, chunk_size=chunk_size)


def linear_attention(q, k, v, *, causal=False, feature_map="elu+1", eps=1e-6,
                     method="auto", backend="auto", chunk_size=None):
    """Linear attention, Eq. (5) (non-causal) or Eq. (9)-(12) (causal).

    out_i = phi(q_i)^T S_i / (phi(q_i)^T z_i + eps), S_i = sum_j phi(k_j) v_j^T and
    z_i = sum_j phi(k_j), over all j, or j <= i if ``causal``.

    Parameters
    ----------
    q, k : ndarray, shape (..., N, D)
    v : ndarray, shape (..., N, M)
        Leading axes (batch, heads, ...) must be equal, and may be absent.
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
        measured best at D = M = 64, 16 for Numba (10% ahead of 32, see
        ``numba_cpu.chunked``) and 32 for NumPy (within 5% of 64).

    Returns
    -------
    out : ndarray, shape (..., N, M), in the inputs' dtype (float16 is computed in float32).

    Cost: O(N F M) time and O(N (F + M)) memory for every method but "quadratic"
    (O(N^2 max(F, M)) time, O(N^2) memory); F is the feature map's width.
    """
    (q, k, v), out_dtype = _checks.check_qkv(q, k, v)
    kw = _options(causal, eps, chunk_size)
    kernel, backend = _kernel(method, backend, causal, _checks.array_module(q))
    phi = get_feature_map(feature_map)
    if _fused(backend, phi):
        out = kernel.attend(q, k, v, elu=True, **kw)
    else:
        out = kernel.attend(phi.forward(q), phi.forward(k), v, **kw)
    return out.astype(out_dtype, copy=False)


def linear_attention_backward(dout, q, k, v, *, causal=False, feature_map="elu+1", eps=1e-6,
                              method="auto", backend="auto",
                              chunk_size=None):
    """Gradients of ``linear_attention`` with respect to q, k and v, Eq. (13)-(15).

    The kernel returns the gradients with respect to the features and v (Eq. 13-15,
    extended to the normaliser); the feature map's vector-Jacobian product carries them back
    to q and k. Causal methods other than "quadratic" recompute the running state instead
    of storing it (section 3.3.1): O(N (F + M)) memory.

    Parameters
    ----------
    dout : ndarray, shape (..., N, M)
        Gradient of the loss with respect to the output.
    q, k, v and keywords
        As given to ``linear_attention``.

    Returns
    -------
    dq, dk : ndarray, shape (..., N, D)
    dv : ndarray, shape (..., N, M)
    """
    (q, k, v, dout), out_dtype = _checks.check_qkv(q, k, v, dout)
    kw = _options(causal, eps, chunk_size)
    kernel, backend = _kernel(method, backend, causal, _checks.array_module(q))
    phi = get_feature_map(feature_map)
    if _fused(backend, phi):
        grads = kernel.attend_backward(dout, q, k, v, elu=True, **kw)
    else:
        dphi_q, dphi_k, dv = kernel.attend_backward(dout, phi.forward(q), phi.forward(k), v,
                                                    **kw)
        grads = phi.vjp(q, dphi_q), phi.vjp(k, dphi_k), dv
    return tuple(g.astype(out_dtype, copy=False) for g in grads)


def linear_attention_step(q_t, k_t, v_t, state=None, *, feature_map="elu+1", eps=1e-6,
                          backend="auto"):
    """One step of causal linear attention as an RNN, Eq. (16)-(19).

    S_t = S_{t-1} + phi(k_t) v_t^T, z_t = z_{t-1} + phi(k_t),
    out_t = phi(q_t)^T S_t / (phi(q_t)^T z_t + eps).
    Scanning it over positions 1..N gives causal ``linear_attention``.

    Parameters
    ----------
    q_t, k_t : ndarray, shape (..., D)
    v_t : ndarray, shape (..., M)
    state : State or None
        (S (..., F, M), z (..., F)) after the previous positions; None starts from zeros.
    feature_map, eps
        As for ``linear_attention``.
    backend : {"auto", "numpy", "numba", "cupy"}
        "cupy" (and "auto" with CuPy arrays) runs one fused kernel over all sequences at
        once; "numba" (and "auto" when numba imports) one compiled call, elu+1 included;
        "numpy" the NumPy step.

    Returns
    -------
    out_t : ndarray, shape (..., M), in the inputs' dtype.
    state : State
        The new (S, z), in the compute dtype (float32 for float16 inputs).

    Cost: O(F M) time and memory per step, whatever the position.
    """
    (q_t, k_t, v_t), out_dtype = _checks.check_step(q_t, k_t, v_t)
    xp = _checks.array_module(q_t)
    _checks.check_choice("backend", backend, _checks.BACKENDS)
    if cuda_launch.wants_cupy(backend, xp):
        backend, step = "cupy", cuda_step.step
    elif _checks.resolve_backend(backend, xp) == "numba":
        from .numba_cpu import step as numba_step  # compiled: imported on first use
        backend, step = "numba", numba_step.step
    else:
        backend, step = "numpy", recurrent.step
    phi = get_feature_map(feature_map)
    fused = _fused(backend, phi)
    phi_q, phi_k = (q_t, k_t) if fused else (phi.forward(q_t), phi.forward(k_t))
    lead, f, m = q_t.shape[:-1], phi_k.shape[-1], v_t.shape[-1]
    state = _as_state(state, (*lead, f, m), q_t.dtype, xp)
    if fused:                    # raw q_t and k_t: the kernel applies elu+1
        out, state = step(phi_q, phi_k, v_t, state, eps, elu=True)
    else:
        out, state = step(phi_q, phi_k, v_t, state, eps)
    return out.astype(out_dtype, copy=False), state


def _as_state(state, s_shape, dtype, xp):
    """``state`` checked against S (..., F, M) and z (..., F) and cast to ``dtype``;
    zeros (Eq. 16) when None."""
    if state is None:
        return recurrent.zero_state(s_shape[:-2], s_shape[-2], s_shape[-1], dtype, xp)
    if not (isinstance(state, tuple) and len(state) == 2):
        raise TypeError(f"state must be None or {_state_shapes(s_shape)}, got "
                        f"{type(state).__name__}")
    s, z = (_checks.as_float_array(n, a) for n, a in zip(("state.S", "state.z"), state))
    if _checks.array_module(s) is not xp or _checks.array_module(z) is not xp:
        raise TypeError(f"state must hold {xp.__name__} arrays like q_t, k_t and v_t, got "
                        f"{type(s).__name__} and {type(z).__name__}")
    if s.shape != s_shape or z.shape != s_shape[:-1]:
        raise ValueError(f"state must be {_state_shapes(s_shape)} for these inputs and "
                         f"feature map, got S {s.shape}, z {z.shape}")
    return State(s.astype(dtype, copy=False), z.astype(dtype, copy=False))


def _state_shapes(s_shape):
    return f"State(S {s_shape}, z {s_shape[:-1]})"
