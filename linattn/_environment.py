"""How linattn's threads share the cores with NumPy's BLAS: three environment variables set
at import, unless the environment already sets them (the OpenMP pair is left alone if it
sets either), and the environment as the user had it for subprocesses that are not ours
(the benchmarks' peers).

A model alternates BLAS matrix products with compiled loops (attention, GELU, layer norm),
and both keep threads. A thread that spins after its work keeps a core from the other:
- ``OMP_WAIT_POLICY=PASSIVE``: the compiled loops' OpenMP threads (Numba's "omp" layer)
  sleep when their loop ends (after libgomp's short spin, next). Read by libgomp when Numba's OpenMP layer loads, at the first
  parallel call. One training step of the paper's copy-task model at batch 16 took 0.37 s
  with libgomp's default wait (spinning a while) against 0.29-0.31 s passive, and
  0.55-0.60 s with ``ACTIVE`` (``python -m linattn.bench.train_step``, 2-core Xeon).
- ``GOMP_SPINCOUNT=10000``: libgomp's threads (Numba's OpenMP on Linux) spin 10,000 times
  (about 0.1 ms) before they sleep, in place of passive's none: generating a token at batch
  1 runs some 40 short parallel loops (``numba_cpu.decode.product``), each of which would
  otherwise wake its threads from sleep: the token's products took 2.4 ms with no spin
  against 0.51 ms with it, and a training step was unchanged (within the 5% noise of
  0.22-0.25 s). Other OpenMP runtimes ignore it and wait passively.
- ``OPENBLAS_THREAD_TIMEOUT=20``: OpenBLAS's threads spin for 2^20 cycles (about 0.4 ms)
  after a product before they sleep, instead of the default 2^28 (about 0.1 s, longer than
  most of the loops between two products). Read when OpenBLAS loads, that is at ``import
  numpy``: it takes effect only if linattn is imported before NumPy (as ``python -m
  linattn ...`` does); set it yourself before Python starts otherwise. SciPy's OpenBLAS,
  which the chunked kernels call, reads it too. Measured on a 2-core Xeon (OpenBLAS
  0.3.31): a training step at batch 16 took 0.26-0.28 s with 2^18 to 2^22 against
  0.30-0.32 s with the default; 2^4 (sleep at once) slowed generation at batch 16 from
  2.3 to 3.6 ms a token, since waking the threads for each of its small products costs
  more than the product, while 2^20 left it unchanged.

One more setting, ``keep_freed_memory``, is made by the training loops, not at import: glibc
returns large freed arrays to the system and page-faults them back on their next use.
"""
import ctypes
import os
import sys

SETTINGS = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000",
            "OPENBLAS_THREAD_TIMEOUT": "20"}

# what the environment said before this module, None where it said nothing
BEFORE = {name: os.environ.get(name) for name in SETTINGS}
# whether OpenBLAS (through NumPy) loads after this point and so reads the timeout
BLAS_TIMEOUT_APPLIES = "numpy" not in sys.modules

# OpenMP's two go together: GOMP_SPINCOUNT overrides the spin a user's wait policy implies
_OPENMP = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
for _name, _value in SETTINGS.items():
    if not (_name in _OPENMP and any(BEFORE[other] is not None for other in _OPENMP)):
        os.environ.setdefault(_name, _value)


def user_environment(**extra):
    """``os.environ`` as it was before linattn set ``SETTINGS``, plus ``extra``: the
    environment for a subprocess that is not ours (the benchmarks' peers), whose threads
    must run as its users have them. PyTorch's many small parallel calls slow down several
    times with passive OpenMP threads: its recurrent model generated an image 4x slower
    here."""
    env = {**os.environ, **extra}
    for name, value in BEFORE.items():
        if name in extra:
            continue
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


# glibc's mallopt parameters (malloc.h) and the largest mmap threshold it accepts (64-bit)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_MAX = 32 << 20


def keep_freed_memory():
    """Make glibc's malloc keep freed arrays of up to 32 MB in the process for reuse,
    instead of returning each to the system, for the rest of the process.

    A training step allocates its activations and gradients afresh (about 400 MB of arrays
    of 2-8 MB per step of the copy-task model at batch 16). Each allocation above glibc's
    threshold is a new mapping whose pages fault in, zeroed, on first write: 12,800 faults
    and 22 ms of system time per 0.26 s step (2-core Xeon); with this, 140 faults, and the
    step 6% faster. The price is that the process's resident memory stays near its peak.
    ``model.train.run``, ``model.speech_train.run_speech`` and the training benchmark call
    it; call it (``linattn.model.keep_freed_memory()``) in your own training loop for the
    same effect.

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
