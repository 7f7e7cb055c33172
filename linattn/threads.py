"""Thread and allocator settings for programs that alternate BLAS products with compiled
loops: opt-in, made by the command-line entry points and the lab, never at import.

A model alternates BLAS matrix products with Numba's parallel loops (attention, GELU, layer
norm), and both keep threads. A thread that spins after its work keeps a core from the other
pool. Three environment variables make idle threads sleep soon:

- ``OMP_WAIT_POLICY=PASSIVE``: the compiled loops' OpenMP threads (Numba's "omp" layer) sleep
  when their loop ends. libgomp reads it when Numba's OpenMP layer loads, at the first
  parallel call, so setting it in a running process before that call works.
- ``GOMP_SPINCOUNT=10000``: libgomp's threads spin about 0.1 ms before they sleep, so that the
  many short parallel loops of a generated token do not each wake sleeping threads. The
  OpenMP pair goes together: a user who sets either keeps the spin that policy implies.
- ``OPENBLAS_THREAD_TIMEOUT=20``: OpenBLAS's threads spin 2^20 cycles (about 0.4 ms) after a
  product instead of its default 2^28 (about 0.1 s, longer than most loops between two
  products). OpenBLAS reads it once, when NumPy loads it: it must be in the environment
  before Python starts.

The decision and its measurements are on the performance page (``docs/performance.md``);
``python -m linattn.lab.bench.train_step`` measures a training step with them.

Use
---
- ``recommended_environment()``: the variables (name -> value) the current environment
  lacks; ``python -m linattn.threads`` prints them as ``NAME=VALUE`` lines, for a shell's
  ``env`` or a launcher.
- ``configure()``: sets them in ``os.environ`` for this process and its children (OpenMP's
  pair takes effect if Numba has not run a parallel loop yet; OpenBLAS's only in children).
- ``relaunch_configured()``: at a program's entry point, replaces the process by the same
  command with the settings in its environment (once), so that OpenBLAS reads its timeout
  too. ``python -m linattn`` and the lab's commands do this.
- ``user_environment()``: the environment without what linattn added, for subprocesses that
  are not ours (the benchmarks' peers), whose threads run as their users have them.
- ``keep_freed_memory()``: glibc keeps freed arrays for reuse; the training commands
  (``keep_freed_memory=True``) and the training benchmark call it.
"""
import ctypes
import os
import sys

SETTINGS = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000",
            "OPENBLAS_THREAD_TIMEOUT": "20"}
# OpenMP's two go together: GOMP_SPINCOUNT overrides the spin a user's wait policy implies
_OPENMP = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# the names linattn added to the environment, comma-separated, so that a relaunched process
# and the peers' subprocesses can tell the user's settings from ours
ADDED = "LINATTN_THREADS_ADDED"


def recommended_environment(environ=None):
    """The settings of ``SETTINGS`` that ``environ`` (default ``os.environ``) does not make.

    Returns
    -------
    dict of str -> str
        Empty when the environment already says everything (a user's OpenMP wait policy or
        spin count keeps both OpenMP variables out).
    """
    environ = os.environ if environ is None else environ
    user_openmp = any(name in environ for name in _OPENMP)
    return {name: value for name, value in SETTINGS.items()
            if name not in environ and not (name in _OPENMP and user_openmp)}


def configure():
    """Set the recommended variables in ``os.environ`` where it says nothing.

    Returns
    -------
    dict of str -> str
        What was set. OpenBLAS reads its timeout only when it loads (at ``import numpy``):
        in this process that was before, so that one applies to child processes only; use
        ``relaunch_configured`` or set it before Python starts.
    """
    added = recommended_environment()
    os.environ.update(added)
    if added:
        names = [n for n in os.environ.get(ADDED, "").split(",") if n] + list(added)
        os.environ[ADDED] = ",".join(names)
    return added


def relaunch_configured():
    """At a program's entry point: if the recommended settings are missing, replace this
    process by the same command (``sys.orig_argv``) with them set; else return.

    Returns only when nothing was missing (or on a platform without ``os.execv``)."""
    if not recommended_environment() or not hasattr(os, "execv"):
        return
    configure()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def user_environment(**extra):
    """``os.environ`` without the variables linattn added, plus ``extra``: the environment
    for a subprocess that is not ours (the benchmarks' peers). PyTorch's many small parallel
    calls slow down several times with passive OpenMP threads."""
    added = [n for n in os.environ.get(ADDED, "").split(",") if n]
    env = {name: value for name, value in os.environ.items()
           if name not in added and name != ADDED}
    env.update(extra)
    return env


# glibc's mallopt parameters (malloc.h) and the largest mmap threshold it accepts (64-bit)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_MAX = 32 << 20


def keep_freed_memory():
    """Make glibc's malloc keep freed arrays of up to 32 MB in the process for reuse, instead
    of returning each to the system, for the rest of the process.

    A training step allocates its activations and gradients afresh; each allocation above
    glibc's threshold is a new mapping whose pages fault in, zeroed, on first write. With
    this setting they are reused; the price is that the process's resident memory stays
    near its peak. A process-wide setting: the training functions make it only when asked
    (``keep_freed_memory=True``, as the command line does).

    Returns
    -------
    applied : bool
        False where the C library has no ``mallopt`` (not glibc): nothing is changed.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # a fixed mmap threshold also stops glibc's own adjustment of the trim threshold
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)
                and mallopt(_M_TRIM_THRESHOLD, 4 * MMAP_THRESHOLD_MAX))


if __name__ == "__main__":                  # python -m linattn.threads: NAME=VALUE lines
    for _name, _value in recommended_environment().items():
        print(f"{_name}={_value}")
