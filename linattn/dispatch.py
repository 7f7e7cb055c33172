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
  features; methods quadratic, linear, chunked, recurrent.
- ``"step"``: ``step(phi_q, phi_k, v, state, eps) -> (out, state)``, one RNN step that
  returns a new state (``linear_attention_step``); ``step_into(phi_q, phi_k, v, S, z, out,
  eps)``, the same step updating the C-contiguous S and z in place and writing ``out``
  (``Recurrence``; eps a scalar of the state's dtype); and ``step_into_compensated(phi_q,
  phi_k, v, S, z, S_c, z_c, out, eps)``, which adds by Kahan's compensated summation, S_c
  and z_c the compensation (the fields of a ``CompensatedState``).
- ``"softmax"``: ``attend(q, k, v, *, causal, scale)`` and ``attend_backward(dout, q, k, v,
  *, causal, scale) -> (dq, dk, dv)``.
- ``"lsh"``: ``attend(qk, v, *, n_hashes, chunk_size, n_buckets, causal, seed)`` and
  ``attend_backward(dout, qk, v, *, ...) -> (dqk, dv)``.

Each module also declares ``FUSED_FEATURE_MAPS``, the feature-map classes it applies itself
to raw q and k when called with ``elu=True`` (the Numba kernels fuse elu+1, Eq. 7); the public
function applies any other map first, so the unfused path is always available and is what the
fused one is tested against.

The "auto" rule, written once:
- backend "auto": "cupy" for CuPy arrays; for NumPy arrays "numba" when numba imports and has
  the method, else "numpy".
- method "auto": ``AUTO_METHOD[family, backend]``, a function of ``causal`` and the queries'
  shape (N, D) where the caller gives it: the fastest form measured on that backend (NumPy:
  running sums non-causal, blocks causal; Numba: the kernel matrix in blocks for short
  sequences, else blocks of positions; CUDA: the chunked scan causal, matrix products
  non-causal). Families without methods (step, softmax, lsh) have the single method "auto".
- an explicit backend without the method asked for is a ValueError that names both.
"""
import importlib

import numpy as np

from . import _checks

BACKENDS = ("auto", "numpy", "numba", "cupy")
METHODS = {"linear": ("auto", "quadratic", "linear", "chunked", "recurrent"),
           "step": ("auto",), "softmax": ("auto",), "lsh": ("auto",)}

# (family, method, backend) -> the module that runs it
TABLE = {
    ("linear", "quadratic", "numpy"): "linattn.forms.quadratic",      # the oracle
    ("linear", "linear", "numpy"): "linattn.forms.cumulative",
    ("linear", "chunked", "numpy"): "linattn.forms.chunked",
    ("linear", "recurrent", "numpy"): "linattn.forms.recurrent",
    ("linear", "linear", "numba"): "linattn.numba_cpu.loops",
    ("linear", "recurrent", "numba"): "linattn.numba_cpu.loops",      # the same running sums
    ("linear", "chunked", "numba"): "linattn.numba_cpu.chunked",
    ("linear", "quadratic", "numba"): "linattn.numba_cpu.quadratic",  # blocks of A, no state
    ("linear", "quadratic", "cupy"): "linattn.forms.quadratic",       # NumPy's, on CuPy arrays
    ("linear", "linear", "cupy"): "linattn.cuda.cumulative",          # v1: a thread per column
    ("linear", "recurrent", "cupy"): "linattn.cuda.cumulative",
    ("linear", "chunked", "cupy"): "linattn.cuda.chunked",            # v2: the chunked scan
    ("step", "auto", "numpy"): "linattn.forms.recurrent",
    ("step", "auto", "numba"): "linattn.numba_cpu.step",
    ("step", "auto", "cupy"): "linattn.cuda.step",
    ("softmax", "auto", "numpy"): "linattn.forms.softmax",           # the N x N oracle
    ("softmax", "auto", "numba"): "linattn.numba_cpu.softmax",
    ("softmax", "auto", "cupy"): "linattn.cuda.softmax",
    ("lsh", "auto", "numpy"): "linattn.forms.lsh",                   # sort, gather, scatter
    ("lsh", "auto", "numba"): "linattn.numba_cpu.lsh",
}

# the (family, backend) pairs the table has, for the check that runs on every call
_BACKENDS_OF = frozenset((family, backend) for family, _, backend in TABLE)

# Numba: "quadratic" (blocks of the N x N kernel matrix, O(N^2 (F + M))) while N is at most
# about the crossover with "chunked" (blocks of positions carrying a state, O(N F M)), which
# grows with the width D. Measured on a 2-core Xeon (Sapphire Rapids, AVX-512, SciPy's
# OpenBLAS 0.3.31), float32, elu+1, 32 rows of D = M, forward + backward on one thread (CPU
# time; the machine was shared): time of chunked / time of quadratic
#   causal, N =     32   48   64   96  127  192  256
#   D = M =  16   1.45 1.32 1.28 1.14 1.01 0.84 0.69
#   D = M =  32   1.43 1.26 1.18 1.04 0.93 0.73 0.63
#   D = M =  64   1.53 1.44 1.30 1.14 1.03 0.82 0.61
#   D = M = 128   2.55 2.22 2.02 1.73 1.34 1.09 0.81
#   non-causal, N = 16   32   48   64   96  127
#   D = M =  16   1.05 1.02 0.79 0.74 0.57 0.44
#   D = M =  32   1.24 1.03 0.83 0.75 0.59 0.57
#   D = M =  64   1.60 1.30 1.06 0.95 0.87 0.58
#   D = M = 128   2.68 2.27 1.89 1.62 1.29 0.95
# so quadratic up to N = max(96, 1.5 D) causal and N = max(32, 0.75 D) without the mask,
# whose N^2 products skip no half. (The paper's copy task, N = 127 and D = 32, runs chunked.)
def _numba_linear(causal, shape):
    if shape is None:                     # the caller did not say: the form for long N
        return "chunked"
    n, d = shape
    longest = max(96, 3 * d // 2) if causal else max(32, 3 * d // 4)
    return "quadratic" if n <= longest else "chunked"


# method "auto" on each backend, as a function of causal and the queries' (N, D) (None when
# the caller does not say)
AUTO_METHOD = {
    ("linear", "numpy"): lambda causal, shape: "chunked" if causal else "linear",
    ("linear", "numba"): _numba_linear,
    ("linear", "cupy"): lambda causal, shape: "chunked" if causal else "linear",
}


def kernel(family, method, backend, xp, causal=False, shape=None):
    """(module, backend name) that computes ``family`` by ``method`` on ``backend``.

    Parameters
    ----------
    family : {"linear", "step", "softmax", "lsh"}
    method : str
        One of ``METHODS[family]``; "auto" picks by ``AUTO_METHOD``.
    backend : {"auto", "numpy", "numba", "cupy"}
    xp : module
        numpy or cupy: the module of the (already checked) input arrays.
    causal : bool
    shape : tuple of int, optional
        The queries' (N, D). Only "auto" methods depend on these two.

    Raises ValueError for unknown names or a method the backend lacks, TypeError for arrays
    the backend cannot take, ImportError / RuntimeError when CuPy or a GPU is missing.
    """
    _checks.check_choice("method", method, METHODS[family])
    _checks.check_choice("backend", backend, BACKENDS)
    if backend != "auto" and (family, backend) not in _BACKENDS_OF:
        others = sorted(b for f, b in _BACKENDS_OF if f == family)
        raise ValueError(f"{family} attention has no {backend} kernel; use backend "
                         f"{' or '.join(repr(b) for b in others)}")
    for name in _candidates(backend, xp):
        chosen = method
        if method == "auto":
            chosen = AUTO_METHOD.get((family, name), _only_auto)(causal, shape)
        if (family, chosen, name) in TABLE:
            return importlib.import_module(TABLE[family, chosen, name]), name
    have = sorted(m for f, m, b in TABLE if f == family and b == backend)
    raise ValueError(f"method {method!r} has no {backend} kernel for {family} attention; "
                     f"{backend} runs {', '.join(have)}; use backend='numpy' for {method!r}")


def _only_auto(causal, shape):
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
    ``import linattn``, which it would slow down by about 0.3 s."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def fuses(module, feature_map):
    """Whether ``module`` applies ``feature_map`` (an object) itself to raw q and k."""
    return type(feature_map) in module.FUSED_FEATURE_MAPS
