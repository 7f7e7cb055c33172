"""The one dispatch table: which backend module computes each public function.

Every public function takes the same path:

    public function (linear.py, recurrence.py, softmax.py, lsh.py)
      -> _checks          every argument checked once (shapes, dtypes, names, eps, ...)
      -> dispatch.kernel  (family, method, backend) -> the backend module, "auto" resolved here
      -> backend module   forms/ (NumPy, the oracles) | numba_cpu/ | cuda/

Nothing else chooses a backend. A new backend or method is one module with the family's
functions below, plus one line in ``TABLE``.

The families and the functions their modules define (same names on every backend):

- ``"linear"``: ``attend(phi_q, phi_k, v, *, causal, eps, chunk_size=None)`` and
  ``attend_backward(dout, phi_q, phi_k, v, *, ...) -> (dphi_q, dphi_k, dv)``, on positive
  features; methods quadratic, linear, chunked, recurrent. With the options: ``key_mask=``,
  ``initial_state=`` (the backward then also returns d initial_state), ``return_state=True``
  (``attend`` returns ``(out, State)``; the backward takes its gradient as ``dstate=``).
- ``"step"``: ``step(phi_q, phi_k, v, state, eps) -> (out, state)``, one RNN step that
  returns a new state (``linear_attention_step``); ``step_into(phi_q, phi_k, v, S, z, out,
  eps)``, the same step updating the C-contiguous S and z in place and writing ``out``
  (``Recurrence``; eps a scalar of the state's dtype); and ``step_into_compensated(phi_q,
  phi_k, v, S, z, S_c, z_c, out, eps)``, which adds by Kahan's compensated summation, S_c
  and z_c the compensation (the fields of a ``CompensatedState``). The gated step (options
  "decay", "log_gate", "unnormalized") takes ``log_gate=`` (..., F) and ``normalize=`` too.
- ``"softmax"``: ``attend(q, k, v, *, causal, scale)`` and ``attend_backward(dout, q, k, v,
  *, causal, scale) -> (dq, dk, dv)``; with the options ``key_mask=`` and ``"lse"``
  (``attend(..., return_lse=True) -> (out, lse)``, ``attend_backward(..., out=, lse=)``).
- ``"lsh"``: ``attend(qk, v, *, n_hashes, chunk_size, n_buckets, causal, seed)`` and
  ``attend_backward(dout, qk, v, *, ...) -> (dqk, dv)``; with the option ``key_mask=``.
- ``"delta"``: ``attend(q, k, v, beta, *, chunk_size=None)`` and ``attend_backward(dout, q, k,
  v, beta, *, ...) -> (dq, dk, dv, dbeta)`` on unit features, always causal, and ``step(q, k,
  v, beta, S) -> (out, S)``; methods recurrent (the oracle) and chunked; with the options
  ``initial_state=`` (an array S (..., F, M); the backward then also returns dS0) and
  ``return_state=True``.

Each module declares what it supports, and ``kernel`` reads nothing else about it:

- ``SUPPORTS``, a frozenset of the options it takes beyond the family's bare call, each
  reaching it by keyword: ``"non_causal"`` (``causal=False``), ``"key_mask"`` (a boolean
  (..., Nk) mask of real keys), ``"initial_state"`` (a ``State`` to start from) and
  ``"return_state"`` (return the final ``State`` too; its backward takes ``dstate``);
  ``"decay"`` and ``"log_gate"`` (a per-head decay or a per-position log gate, both reaching
  the kernel as ``log_gate=`` (..., N, F), the decay folded in as its log; its backward then
  returns dlog_gate after dv) and ``"unnormalized"`` (``normalize=False``): see
  ``forms.decay``; ``"lse"``, softmax's log-sum-exp returned by the forward and taken by the
  backward.
  A new option lands in the NumPy forms first; "auto" skips a module without it, and an
  explicit backend whose modules all lack it is a ValueError naming backend, method and option.
- ``FUSED_FEATURE_MAPS``, the feature-map classes it applies itself to raw q and k when called
  with ``elu=True`` (the Numba kernels fuse elu+1, Eq. 7); the public function applies any
  other map first, so the unfused path is always available and is what the fused one is
  tested against.

A table entry is a module, or a tuple of modules tried in order: the first whose ``SUPPORTS``
has every option the call needs runs it. CuPy's causal kernels are followed by NumPy's forms,
which run on CuPy arrays through ``xp``: the non-causal case (two matrix products) and the
options the kernels do not have yet.

The "auto" rule, written once:
- backend "auto": "cupy" for CuPy arrays; for NumPy arrays "numba" when numba imports and has
  the method, else "numpy".
- method "auto": ``AUTO_METHOD[family, backend]``, a function of ``causal``, the queries'
  shape (N, D) where the caller gives it, and the options the call needs: the form that
  measurements of forward + backward chose on that backend (NumPy: running sums non-causal,
  blocks causal; Numba: the kernel matrix in blocks for short sequences, else blocks of
  positions, and the gated running sums for a decay, a gate or no normaliser; CUDA: the
  chunked scan causal, matrix products non-causal; the delta rule: its chunked WY form on
  NumPy and Numba). For Numba, the performance page (docs/performance.md) shows the timings
  of its last run, and where a forward alone ran faster as the running sums. Families
  without methods (step, softmax, lsh) have the single method "auto".
- options: a module lacking one the call needs is skipped (by "auto", for the next module of
  the entry, then the next backend); an explicit backend with none that has it is a ValueError.
- an explicit backend without the method asked for is a ValueError that names both.
"""
import importlib

import numpy as np

from . import _checks

BACKENDS = ("auto", "numpy", "numba", "cupy")
METHODS = {"linear": ("auto", "quadratic", "linear", "chunked", "recurrent"),
           "step": ("auto",), "softmax": ("auto",), "lsh": ("auto",),
           "delta": ("auto", "recurrent", "chunked")}

# (family, method, backend) -> the module that runs it, or the modules tried in order
TABLE = {
    # the oracles; with a decay, a log gate or no normaliser, the gated forms after them
    ("linear", "quadratic", "numpy"): ("linattn.forms.quadratic", "linattn.forms.decay"),
    ("linear", "linear", "numpy"): ("linattn.forms.cumulative",
                                    "linattn.forms.decay_recurrent"),
    ("linear", "chunked", "numpy"): ("linattn.forms.chunked", "linattn.forms.decay_chunked"),
    ("linear", "recurrent", "numpy"): ("linattn.forms.recurrent",
                                       "linattn.forms.decay_recurrent"),
    ("linear", "linear", "numba"): ("linattn.numba_cpu.loops",       # gated: decay_loops
                                    "linattn.numba_cpu.decay_loops"),
    ("linear", "recurrent", "numba"): ("linattn.numba_cpu.loops",    # the same running sums
                                       "linattn.numba_cpu.decay_loops"),
    ("linear", "chunked", "numba"): "linattn.numba_cpu.chunked",
    ("linear", "quadratic", "numba"): "linattn.numba_cpu.quadratic",  # blocks of A, no state
    ("linear", "quadratic", "cupy"): "linattn.forms.quadratic",       # NumPy's, on CuPy arrays
    # CUDA kernels are causal only: NumPy's forms on CuPy arrays run the rest
    ("linear", "linear", "cupy"): ("linattn.cuda.cumulative",         # v1: a thread per column
                                   "linattn.forms.cumulative"),
    ("linear", "recurrent", "cupy"): ("linattn.cuda.cumulative", "linattn.forms.cumulative"),
    ("linear", "chunked", "cupy"): ("linattn.cuda.chunked",           # v2: the chunked scan
                                    "linattn.forms.chunked"),
    ("step", "auto", "numpy"): ("linattn.forms.recurrent", "linattn.forms.decay_recurrent"),
    ("step", "auto", "numba"): "linattn.numba_cpu.step",
    ("step", "auto", "cupy"): "linattn.cuda.step",
    ("softmax", "auto", "numpy"): "linattn.forms.softmax",           # the N x N oracle
    ("softmax", "auto", "numba"): "linattn.numba_cpu.softmax",
    ("softmax", "auto", "cupy"): ("linattn.cuda.softmax", "linattn.forms.softmax"),
    ("lsh", "auto", "numpy"): "linattn.forms.lsh",                   # sort, gather, scatter
    ("lsh", "auto", "numba"): "linattn.numba_cpu.lsh",
    ("delta", "recurrent", "numpy"): "linattn.forms.delta",          # the oracle: the scan
    ("delta", "chunked", "numpy"): "linattn.forms.delta_chunked",    # the WY form
    ("delta", "recurrent", "numba"): "linattn.numba_cpu.delta",      # the scan, compiled
    ("delta", "chunked", "numba"): "linattn.numba_cpu.delta_chunked",  # the WY form, compiled
}

# the (family, backend) pairs the table has, for the check that runs on every call
_BACKENDS_OF = frozenset((family, backend) for family, _, backend in TABLE)

# Numba: "quadratic" (blocks of the N x N kernel matrix, O(N^2 (F + M))) up to a length that
# grows with D, then "chunked" (blocks of positions carrying a state, O(N F M)); the bound is
# lower without the causal mask, whose N^2 products then skip no half. The bounds are the
# crossover of the two forms as measured when they were set; the lab's benchmark does not
# time "quadratic" now (docs/performance.md shows the rule's lengths for each D).
# With a decay, a gate or no normaliser the running sums are Numba's only compiled form
# (``numba_cpu.decay_loops``); "auto" takes them over NumPy's chunked form. The lab times both
# (``python -m linattn.lab.bench``, its auto_rules; docs/performance.md).
GATED = frozenset({"decay", "log_gate", "unnormalized"})


def _numba_linear(causal, shape, needs):
    if needs & GATED:
        return "recurrent"
    if shape is None:                     # the caller did not say: the form for long N
        return "chunked"
    n, d = shape
    longest = max(96, 3 * d // 2) if causal else max(32, 3 * d // 4)
    return "quadratic" if n <= longest else "chunked"


# method "auto" on each backend, as a function of causal, the queries' (N, D) (None when
# the caller does not say) and the options the call needs
AUTO_METHOD = {
    ("linear", "numpy"): lambda causal, shape, needs: "chunked" if causal else "linear",
    ("linear", "numba"): _numba_linear,
    ("linear", "cupy"): lambda causal, shape, needs: "chunked" if causal else "linear",
    ("delta", "numpy"): lambda causal, shape, needs: "chunked",
    # Numba: the WY form's chunks rather than the compiled scan; the lab times both
    # (``python -m linattn.lab.bench``, its auto_rules; docs/performance.md)
    ("delta", "numba"): lambda causal, shape, needs: "chunked",
}


OPTIONS = ("non_causal", "key_mask", "initial_state", "return_state",
           "decay", "log_gate", "unnormalized", "lse")


def given(**options):
    """The options given a value (not None, not False): only these reach a kernel, by
    keyword, so that a kernel is never passed an option it does not declare."""
    return {name: value for name, value in options.items()
            if value is not None and value is not False}


def needed(*, causal=True, **options):
    """The ``SUPPORTS`` names a call needs: "non_causal" unless ``causal``, and each of
    ``options`` (keyword = an option name of ``OPTIONS``) that is ``given``.
    ``needed(causal=False, key_mask=mask)`` is {"non_causal", "key_mask"}."""
    return frozenset(set(given(**options)) | ({"non_causal"} if not causal else set()))


def kernel(family, method, backend, xp, causal=False, shape=None, needs=frozenset()):
    """(module, backend name) that computes ``family`` by ``method`` on ``backend``.

    Parameters
    ----------
    family : {"linear", "step", "softmax", "lsh", "delta"}
    method : str
        One of ``METHODS[family]``; "auto" picks by ``AUTO_METHOD``.
    backend : {"auto", "numpy", "numba", "cupy"}
    xp : module
        numpy or cupy: the module of the (already checked) input arrays.
    causal : bool
    shape : tuple of int, optional
        The queries' (N, D). Only "auto" methods depend on these two.
    needs : frozenset of str
        The options the call uses (``needed``): only a module whose ``SUPPORTS``
        holds them all is chosen.

    Raises ValueError for unknown names, a method the backend lacks or an option none of its
    modules for the method has, TypeError for arrays the backend cannot take, ImportError /
    RuntimeError when CuPy or a GPU is missing.
    """
    _checks.check_choice("method", method, METHODS[family])
    _checks.check_choice("backend", backend, BACKENDS)
    if backend != "auto" and (family, backend) not in _BACKENDS_OF:
        others = sorted(b for f, b in _BACKENDS_OF if f == family)
        raise ValueError(f"{family} attention has no {backend} kernel (method {method!r}); "
                         f"use backend "
                         f"{' or '.join(repr(b) for b in others)}")
    lacking = ()
    for name in _candidates(backend, xp):
        chosen = method
        if method == "auto":
            chosen = AUTO_METHOD.get((family, name), _only_auto)(causal, shape, needs)
        if (family, chosen, name) not in TABLE:
            continue
        entry = TABLE[family, chosen, name]
        for module_name in (entry,) if isinstance(entry, str) else entry:
            module = importlib.import_module(module_name)
            lacking = sorted(set(needs) - module.SUPPORTS)
            if not lacking:
                return module, name
        if backend != "auto":
            raise ValueError(f"backend {backend!r} has no {family} kernel for method "
                             f"{chosen!r} with {', '.join(lacking)}; use backend='numpy' "
                             f"{' (or auto, which falls back to it)' if xp is np else ''} "
                             f"for {', '.join(lacking)}")
    if lacking:                           # "auto": every candidate lacks an option
        raise ValueError(f"no backend runs {family} attention by method {method!r} with "
                         f"{', '.join(lacking)} on {xp.__name__} arrays")
    have = sorted(m for f, m, b in TABLE if f == family and b == backend)
    raise ValueError(f"method {method!r} has no {backend} kernel for {family} attention; "
                     f"{backend} runs {', '.join(have)}; use backend='numpy' for {method!r}")


def _only_auto(causal, shape, needs):
    return "auto"


def _candidates(backend, xp):
    """The backends to try, in order, for ``backend`` and arrays of module ``xp``."""
    on_gpu = xp.__name__ == "cupy"
    if backend == "auto":
        if on_gpu:
            return ("cupy",)
        return ("numba", "numpy") if numba_imports() else ("numpy",)
    if backend == "cupy":
        from .cuda.launch import require_cupy
        require_cupy()                     # ImportError / RuntimeError naming what is missing
        if not on_gpu:
            raise TypeError("backend='cupy' takes CuPy arrays, got NumPy arrays; move them to "
                            "the GPU with cupy.asarray(x) (linattn makes no hidden host-device "
                            "copies)")
    if backend == "numba":
        if xp is not np:
            raise TypeError("backend 'numba' runs on NumPy arrays; CuPy arrays need 'cupy' "
                            "or 'auto'")
        if not numba_imports():
            raise ValueError("backend 'numba' needs the numba package; install it or use "
                             "'numpy'")
    return (backend,)                      # "numpy" also runs on CuPy arrays, through xp


def numba_imports():
    """Whether numba can be imported. It is imported here, on first use, not by
    ``import linattn``, which it would slow down noticeably."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def fuses(module, feature_map):
    """Whether ``module`` applies ``feature_map`` (an object) itself to raw q and k
    (``FUSED_FEATURE_MAPS``)."""
    return type(feature_map) in module.FUSED_FEATURE_MAPS
