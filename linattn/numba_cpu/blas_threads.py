"""The BLAS that Numba's compiled products call (SciPy's): which kernel it runs, and holding it
to the calling thread while a parallel kernel calls it from each of its threads.

OpenBLAS runs a product of m n k multiply-adds on the calling thread below 2^19
(``chunked.SINGLE_THREAD_PRODUCT``), and on floor(m n k / 2^18) threads from there. Called
from Numba's threads, a product at or above that threshold wakes OpenBLAS's threads too, and
they fight Numba's: the tiled softmax ran several times slower with such products. So the
kernels keep each product under the threshold, unless ``hold()`` holds the BLAS to one
thread while they run.

Whether larger products pay depends on OpenBLAS's kernel. The tiled softmax forward and
backward at N = 4096, 8 heads, D = M = 64, float32 on 2 threads, with tiles of 256 x 256
held to one thread, against the tiles under the threshold: faster with the Haswell kernel (an
AVX2 machine's, or OPENBLAS_CORETYPE=Haswell on an x86 with AVX2), slower with the SkylakeX
kernel (AVX-512), on a 2-core AVX-512 Xeon whose OpenBLAS ran either kernel. Compiling
Numba's loops for Haswell instead did not change which was faster; the BLAS kernel did.
``large_products()`` says which applies.

``hold()`` changes state the whole process shares: while it holds, a product that
another Python thread makes through SciPy's BLAS runs on one thread too. A hold is a lock:
holds nest within a thread, and a hold from another thread waits for the first to end (each
kernel uses every core anyway), so that the thread that set one thread restores what it
found. The hold reports whether it took: OpenBLAS 0.3.30 ignored the settings of a thread
other than the main one once the main thread had made one, and a kernel told so keeps its
products under the threshold. The BLAS is found with threadpoolctl at the first call that
asks about it (``kernel``, ``large_products`` or a hold), not at import. Where threadpoolctl
finds no BLAS it can set, ``large_products()`` is False and the kernels keep their products
under the threshold.
"""
import contextlib
import functools
import os
import threading

# OpenBLAS's kernels (``openblas_get_corename``) with which larger products were measured
# faster (Haswell), or whose matrix products are Haswell's (Zen: OpenBLAS's KERNEL.ZEN builds
# its sgemm and dgemm from the Haswell kernels); every other kernel, and every other BLAS,
# keeps the products under the threshold
LARGE_PRODUCT_KERNELS = frozenset({"haswell", "zen"})

_lock = threading.RLock()
_holds = 0
_saved = []           # (controller, its number of threads) while a hold is in place
_took = False         # whether the hold in place found a BLAS and set each to one thread


@functools.lru_cache(maxsize=1)
def _controllers():
    """threadpoolctl's controllers of the BLAS that SciPy ships (the one Numba calls), or of
    every BLAS where none lies in SciPy's folder (a system BLAS); () where threadpoolctl or
    SciPy will not import (both are dependencies: a broken install keeps the small sizes)."""
    try:
        import scipy
        import scipy.linalg.cython_blas  # noqa: F401 (loads the library Numba calls)
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return ()
    blas = ThreadpoolController().select(user_api="blas").lib_controllers
    scipy_dir = os.path.dirname(scipy.__file__)   # a prefix of scipy/ and scipy.libs/
    own = [c for c in blas if c.filepath.startswith(scipy_dir)]
    return tuple(own or blas)


def kernel():
    """The name OpenBLAS gives its kernel, lower case ("haswell", "skylakex", ...), or None
    when no OpenBLAS was found, or where the BLAS found (every BLAS, when none lies in SciPy's
    folder) name more than one kernel."""
    names = {getattr(c, "architecture", None) for c in _controllers()
             if c.internal_api == "openblas"}
    names.discard(None)
    return names.pop().lower() if len(names) == 1 else None


def large_products():
    """Whether a parallel kernel should make products above OpenBLAS's threading threshold
    (held to one thread by ``hold``): True for the kernels in
    ``LARGE_PRODUCT_KERNELS``."""
    return kernel() in LARGE_PRODUCT_KERNELS


@contextlib.contextmanager
def hold():
    """Within the block, SciPy's BLAS runs each product on the thread that calls it; after,
    its number of threads is what it was (see the module's note on shared state). Yields
    whether it holds: False where no BLAS was found, or where the BLAS kept its threads.
    (The lab's ``bench.timing.one_thread`` is another thing: it pins every thread pool and
    Numba for a timing, and is never called inside a kernel.)"""
    global _holds, _took
    with _lock:                  # a hold from another thread waits for this one to end
        if _holds == 0:
            _saved[:] = [(c, c.get_num_threads()) for c in _controllers()]
            for c, _ in _saved:
                c.set_num_threads(1)
            _took = bool(_saved) and all(c.get_num_threads() == 1 for c, _ in _saved)
        _holds += 1
        try:
            yield _took
        finally:
            _holds -= 1
            if _holds == 0:
                for c, threads in _saved:
                    c.set_num_threads(threads)
                _saved.clear()
                _took = False


def holding():
    """Whether a hold that took is in place (in this process, from any thread)."""
    return _holds > 0 and _took
