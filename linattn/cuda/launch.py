"""Compiling and launching the CUDA sources of ``linattn/cuda/*.cu``, and the check that says
clearly why a call cannot run on the GPU (``require_cupy``, called by ``linattn.dispatch``).

Each ``.cu`` file is compiled by CuPy (NVRTC) once per dtype, with ``-DLINATTN_REAL=float`` or
``double`` naming its scalar type ``real``; CuPy also caches the binary on disk. CuPy appends
``-ftz=true`` to every RawModule's options (``CUPY_ADDS``), so float32 subnormals flush to zero
on the GPU; the nvcc tests and the device variant of the emulated tests compile with
``options(dtype) + CUPY_ADDS``. The compiled kernels are looked up once per process and device
(``_kernel``): a per-token ``Recurrence.step`` pays a dictionary lookup, not a ``RawModule``
function lookup. CuPy is imported only inside functions.
"""
import functools
import math
from pathlib import Path

import numpy as np

from .._checks import array_module  # noqa: F401  (the launchers call launch.array_module)

THREADS = 256    # every kernel's block size (THREADS in the .cu files)
TILE = 64        # chunk length and tile width of the chunked kernels (TILE in causal_product.cu)
SOURCES = ("causal_product.cu", "rnn_step.cu", "softmax.cu")
CUPY_ADDS = ("-ftz=true",)   # what cupy.cuda.compiler appends to every NVRTC compile
_REAL = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


def require_cupy():
    """The cupy module, or an ImportError / RuntimeError naming what is missing."""
    try:
        import cupy
    except ImportError as err:
        raise ImportError("backend='cupy' needs CuPy, which is not installed; install the "
                          "build matching your CUDA, e.g. pip install cupy-cuda12x") from err
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except RuntimeError as err:   # CuPy's CUDARuntimeError: no driver, no device, ...
        raise RuntimeError(f"backend='cupy' needs an NVIDIA GPU, but CUDA reports: {err}") from err
    if count < 1:
        raise RuntimeError("backend='cupy' needs an NVIDIA GPU, but CUDA reports none")
    return cupy


def require_causal(causal):
    """A ValueError unless ``causal``: the scans are causal; the dispatch table routes
    non-causal calls to NumPy's forms, which run on CuPy arrays."""
    if not causal:
        raise ValueError("the CUDA scans are causal only; call linattn.linear_attention, "
                         "whose dispatch table runs non-causal attention on NumPy's forms")


def options(dtype):
    """The compiler options of every source for ``dtype`` (float32 or float64), as passed to
    CuPy (which adds ``CUPY_ADDS``)."""
    return ("-std=c++17", f"-DLINATTN_REAL={_REAL[np.dtype(dtype)]}")


def source_path(name):
    """The path of the CUDA source ``name`` (one of SOURCES)."""
    return Path(__file__).with_name(name)


@functools.cache
def _module(name, dtype_name):
    """The RawModule of source ``name`` for one dtype: NVRTC runs at its first get_function."""
    cupy = require_cupy()
    return cupy.RawModule(code=source_path(name).read_text(), options=options(dtype_name))


@functools.cache
def _kernel(name, function, dtype_name, device):
    """The kernel ``function`` of source ``name`` for one dtype, loaded on CUDA ``device`` (a
    module is loaded per device, so the device is part of the key)."""
    return _module(name, dtype_name).get_function(function)


def kernel(name, function, dtype):
    """The compiled kernel ``function`` of source ``name`` for ``dtype`` on the current device,
    compiled on first use and then looked up in ``_kernel``'s cache."""
    import cupy  # importable: linattn.dispatch called require_cupy before any launch

    return _kernel(name, function, np.dtype(dtype).name, cupy.cuda.runtime.getDevice())


def launch(name, function, grid, args):
    """Launch ``function`` of source ``name`` on ``grid`` blocks of THREADS threads, on CuPy's
    current stream.

    ``args`` are CuPy arrays (all of one dtype, which picks the compiled version), None for a
    null pointer, Python ints (passed as 32-bit ints, or 64-bit where the kernel takes an
    ``index_t``: pass those as numpy.int64) and Python floats (passed as the arrays' dtype).
    """
    dtype = next(a.dtype for a in args if hasattr(a, "dtype") and not np.isscalar(a))
    real = dtype.type
    typed = tuple(real(a) if isinstance(a, float) else np.int32(a) if isinstance(a, int)
                  else a for a in args)
    grid = tuple(int(g) for g in grid)
    if min(grid) > 0:
        kernel(name, function, dtype)(grid, (THREADS,), typed)


def blocks(count):
    """Blocks of THREADS threads that cover ``count`` threads."""
    return math.ceil(count / THREADS)
