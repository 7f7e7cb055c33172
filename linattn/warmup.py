"""Compile the attention kernels now, instead of at their first call.

Every Numba kernel compiles on its first call in a process whose disk cache (Numba's, beside
the sources or in ``NUMBA_CACHE_DIR``) does not hold it yet, once for each cache, announced
by one line on stderr (``linattn.numba_cpu.compile_notice``); compiling takes seconds to
minutes, loading from the cache far less. ``warmup`` makes
those first calls on small arrays, so that a lesson, a benchmark or a demo starts warm:

    python -m linattn warmup                       # float32, the usual families
    python -m linattn warmup --dtypes float32 float64 --families linear step softmax lsh

With a warm cache it only loads the kernels. The model's own kernels (training, generation)
compile at their first call.
"""
import sys
import time

import numpy as np

from ._cli_types import Parser
from .dispatch import numba_imports
from .linear import linear_attention, linear_attention_backward, linear_attention_step
from .lsh import lsh_attention, lsh_attention_backward
from .recurrence import Recurrence
from .softmax import softmax_attention, softmax_attention_backward

DTYPES = ("float32", "float64")
FAMILIES = ("linear", "step", "softmax", "lsh")

# linear attention's Numba forms: "auto" takes blocks of the kernel matrix up to N = 96 and
# blocks of positions beyond (the "auto" rule of dispatch), "linear" the running sums
_LINEAR_METHODS = ("quadratic", "chunked", "linear")


def warmup(dtypes=("float32",), causal=(True, False), families=("linear", "step", "softmax")):
    """Call each Numba kernel of ``families`` once per dtype and mask on small inputs (forward
    and backward), so that it is compiled (or loaded from the disk cache) now.

    Parameters
    ----------
    dtypes : sequence of {"float32", "float64"}
    causal : sequence of bool
        The masks to call with (the kernels take the mask as an argument: one compile
        serves both, but each is called once).
    families : sequence of {"linear", "step", "softmax", "lsh"}
        "linear": ``linear_attention`` and its backward by blocks of the kernel matrix, by
        blocks of positions and by running sums; "step": ``linear_attention_step`` and
        ``Recurrence.step``; "softmax": ``softmax_attention``; "lsh": ``lsh_attention``.

    Returns
    -------
    seconds : dict
        (family, dtype) -> seconds it took (compiling or loading).

    Raises ValueError for an unknown dtype or family, TypeError for a mask that is not a
    bool, ImportError when numba is missing.
    """
    if not numba_imports():
        raise ImportError("warmup compiles the Numba kernels: install numba first")
    for name, given, valid in (("dtypes", dtypes, DTYPES), ("families", families, FAMILIES)):
        unknown = [x for x in given if x not in valid]
        if isinstance(given, str) or unknown:
            raise ValueError(f"{name} must be a sequence of {', '.join(valid)}, got {given!r}")
    for mask in causal:
        if not isinstance(mask, (bool, np.bool_)):
            raise TypeError(f"causal must be a sequence of bools, got {causal!r}")
    seconds = {}
    for dtype in dtypes:
        q = np.random.default_rng(0).standard_normal((1, 2, 128, 8)).astype(dtype)
        for family in families:
            start = time.perf_counter()
            _CALLS[family](q, causal)
            seconds[family, dtype] = time.perf_counter() - start
    return seconds


def _linear(q, causal):
    for mask in causal:
        for method in _LINEAR_METHODS:
            linear_attention(q, q, q, causal=mask, method=method, backend="numba")
            linear_attention_backward(q, q, q, q, causal=mask, method=method, backend="numba")


def _step(q, causal):
    q_t = q[..., 0, :]
    linear_attention_step(q_t, q_t, q_t, backend="numba")
    Recurrence(q_t.shape[:-1], q_t.shape[-1], q_t.shape[-1], dtype=q.dtype,
               backend="numba").step(q_t, q_t, q_t)


def _softmax(q, causal):
    # the tiles run serially below a size and on all threads above it (two kernels each):
    # 128 positions stay serial, 1024 are over the threshold even with the causal mask
    longer = np.random.default_rng(1).standard_normal((1, 2, 1024, 8)).astype(q.dtype)
    for x in (q, longer):
        for mask in causal:
            out, lse = softmax_attention(x, x, x, causal=mask, backend="numba",
                                         return_lse=True)
            softmax_attention_backward(x, x, x, x, causal=mask, backend="numba")
            softmax_attention_backward(x, x, x, x, causal=mask, backend="numba", out=out,
                                       lse=lse)


def _lsh(q, causal):
    for mask in causal:
        lsh_attention(q, q, causal=mask, chunk_size=16, backend="numba")
        lsh_attention_backward(q, q, q, causal=mask, chunk_size=16, backend="numba")


_CALLS = {"linear": _linear, "step": _step, "softmax": _softmax, "lsh": _lsh}


def main(argv=None):
    """``python -m linattn warmup [--dtypes ...] [--families ...]``: compile, then say how
    long each family took."""
    ap = Parser(prog="python -m linattn warmup",
                description="Compile the common Numba kernels now (once per machine; later "
                            "runs load them from Numba's disk cache).")
    ap.add_argument("--dtypes", nargs="+", choices=DTYPES, default=["float32"])
    ap.add_argument("--families", nargs="+", choices=FAMILIES,
                    default=["linear", "step", "softmax"])
    args = ap.parse_args(argv)
    if not numba_imports():
        ap.error("numba is not installed: there is nothing to compile (pip install numba)")
    for (family, dtype), s in warmup(args.dtypes, (True, False), args.families).items():
        print(f"{dtype} {family}: ready in {s:.1f} s", file=sys.stderr)
    return 0
