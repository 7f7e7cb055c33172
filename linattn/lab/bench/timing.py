"""How the benchmark measures: wall time, peak memory, the machine, and its matmul ceiling.

- ``settle``: a pause between cases, so that one case's idle threads do not slow the next.
- ``seconds``, ``once``: median and best wall time of a call, after warm-up calls
  (compilation, caches), by ``timeit``: the one timer of the package; ``point``: the
  forward and forward + backward timings of one benchmark point, each timed once where the
  first forward + backward takes over ``SLOW`` seconds; ``cpu_seconds`` the same in CPU
  time, and ``one_thread`` / ``thread_counts`` to pin and name the threads (the notebooks
  time with these). Tables show medians (one call's time in both columns where ``point``
  timed once); the head-to-head ratios compare best times, which other processes on a
  shared machine disturb least.
- ``interleaved``: best times of several calls taken in turn, for ratios that a shared
  machine's load would otherwise tilt; ``blas_limiter`` sets the BLAS threads (NumPy's and
  SciPy's) for it. ``medians_in_turn``: the medians of two sides, each a round that times
  itself (the generation benchmark's: ours, and a peer's process).
- ``over_budget``: whether a benchmark point ends its curve (a time budget a call, or a
  token).
- ``peak_bytes``: the largest amount of memory a call holds beyond what existed before it
  (``tracemalloc`` sees every NumPy array, including those the kernels write into, and the
  buffers Numba allocates inside a compiled loop, which go through Python's allocator too).
- ``peak_rss_bytes``: the peak growth of resident memory during a call, which also sees
  PyTorch's own allocations (Linux): the peers' measure.
- ``machine``: CPU model, cores, library versions, the BLAS (threadpoolctl), the kernel sizes
  that follow from it.
- ``matmul_gflops``: float32 matrix-product GFLOP/s through NumPy, the ceiling each result is
  compared with.
"""
import contextlib
import os
import pathlib
import platform
import sys
import time
import timeit
import tracemalloc

import numpy as np


def seconds(f, repeats=5, warmup=1):
    """(median, best) wall time of ``f()`` over ``repeats`` calls (``timeit``), after
    ``warmup`` calls."""
    for _ in range(warmup):
        f()
    times = timeit.repeat(f, number=1, repeat=repeats)
    return float(np.median(times)), min(times)


def once(f):
    """Wall time of one call of ``f()`` (``timeit``)."""
    return timeit.timeit(f, number=1)


def over_budget(seconds, budget, batch, n, tokens=None):
    """Whether a forward + backward of ``batch`` x ``n`` tokens that took ``seconds`` ends its
    curve: over ``budget`` seconds a call, or, with ``tokens`` T, over budget / T seconds a
    token (a call of batch 1 past N = T is allowed N / T times the budget). With T, runs of
    different T and the budget in proportion stop a curve at the same N where its time per
    token does not depend on the batch."""
    budgets = 1 if tokens is None else batch * n / tokens    # the call's tokens, in units of T
    return seconds > budget * budgets


# seconds: a benchmark call this slow is timed once (``point``); repeating its forward and
# its forward + backward would cost tens of seconds a point, and over a minute at the
# figure's slowest points
SLOW = 2.0


def point(forward, forward_backward, repeats, warm):
    """Timings of one benchmark point: (forward median, forward best, forward + backward
    median, forward + backward best), in seconds.

    A first ``forward_backward()`` warms up and gives the size: under ``SLOW`` seconds,
    each call is timed ``repeats`` times; over it, once. Then, if ``warm`` (the same code ran
    before in this process, at other sizes, so nothing compiles), the first call is that
    one forward + backward timing: at a new size it is not systematically slower than the
    next (measured on a 2-core Xeon for six of our cases and three of the peers', N = 512
    to 32768: the first of three calls fell on either side of the other two, or within
    their spread). Where ``warm`` is False the first call may compile, and a fast case
    whose compiling takes over ``SLOW`` is timed once at that size. ``forward`` follows
    the forward + backward, which ran its code."""
    first = once(forward_backward)
    reps = repeats if first < SLOW else 1
    fwd = seconds(forward, reps, warmup=0)
    if reps == 1 and warm:
        return (*fwd, first, first)
    return (*fwd, *seconds(forward_backward, reps, warmup=0))


def cpu_seconds(f, repeat=2, at_least=0.02):
    """CPU seconds per call of ``f()`` (``time.process_time``, by ``timeit``): the best of
    ``repeat`` timings of as many calls as take ``at_least`` seconds, over their number. CPU
    time is what the notebooks compare on a shared machine, where wall time also counts the
    neighbours; with ``one_thread`` it is the work of one core."""
    timer = timeit.Timer(f, timer=time.process_time)
    number = 1
    while timer.timeit(number) < at_least:             # the first pass also compiles
        number *= 2
    return min(timer.repeat(number=number, repeat=repeat)) / number


@contextlib.contextmanager
def one_thread():
    """Every thread pool threadpoolctl finds (NumPy's and SciPy's BLAS among them) and
    Numba's compiled loops on one thread each, restored afterwards."""
    import numba
    from threadpoolctl import threadpool_limits
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        with threadpool_limits(1):
            yield
    finally:
        numba.set_num_threads(threads)


def thread_counts():
    """One line naming the threads a timing ran on: the BLAS's, Numba's and the cores."""
    import numba
    from threadpoolctl import threadpool_info
    blas = ", ".join(f"{lib['internal_api']} {lib['num_threads']}" for lib in threadpool_info()
                     if lib["user_api"] == "blas")
    return (f"threads: BLAS ({blas}), numba {numba.get_num_threads()} "
            f"(threading layer {_threading_layer(numba)}), of {os.cpu_count()} cores")


def interleaved(calls, rounds, pause=0.0):
    """{name: best wall time} of each ``(setup, call)`` in ``calls`` (a dict), the calls
    taken in turn for ``rounds`` rounds, each round after ``settle(pause)``; before each
    timed call, ``setup()`` and one untimed call (it wakes the threads the call needs)."""
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(rounds):
        settle(pause)
        for name, (setup, call) in calls.items():
            setup()
            call()
            best[name] = min(best[name], once(call))
    return best


def medians_in_turn(ours, theirs, rounds, pause=0.0):
    """(median of ``ours()``, median of ``theirs()``) over ``rounds`` rounds, one of ours then
    one of theirs each round, each after ``settle(pause)``. Each returns the seconds of its
    own round (the other side may time itself in another process)."""
    mine, other = [], []
    for _ in range(rounds):
        settle(pause)
        mine.append(ours())
        settle(pause)
        other.append(theirs())
    return float(np.median(mine)), float(np.median(other))


def blas_limiter():
    """``set(n)``: every BLAS threadpoolctl finds (NumPy's and SciPy's) on ``n`` threads;
    ``set(None)``: each back to the threads it had when the limiter was made."""
    from threadpoolctl import ThreadpoolController
    blas = ThreadpoolController().select(user_api="blas")
    before = [(lib, lib.get_num_threads()) for lib in blas.lib_controllers]

    def limit(n):
        if n is None:
            for lib, threads in before:
                lib.set_num_threads(threads)
        else:
            blas.limit(limits=n)
    return limit


def settle(seconds):
    """Wait until the thread pools of the previous measurement are asleep: OpenBLAS and
    OpenMP workers spin for a while after their last task, and on few cores a spinning
    worker would slow the next case's threads down."""
    time.sleep(seconds)


def peak_bytes(f):
    """Peak bytes that tracemalloc traces during ``f()`` beyond what was held before it:
    NumPy's arrays and those Numba's compiled code allocates (both go through Python's
    allocator)."""
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        f()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - before


def peak_rss_bytes(f):
    """Peak growth of the process's resident memory during ``f()``, in bytes: the kernel's
    high-water mark (VmHWM) reset before the call (/proc/self/clear_refs), minus the resident
    size then. It sees every allocation, NumPy's, Numba's and PyTorch's alike, at page
    granularity; None where Linux's /proc does not allow it."""
    try:
        before = _status_bytes("VmRSS")
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")                           # 5: reset the peak to the current RSS
    except OSError:
        return None
    f()
    return max(0, _status_bytes("VmHWM") - before)


def _status_bytes(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024          # the file counts kB
    raise OSError(f"no {field} in /proc/self/status")


def matmul_gflops(n=2048, repeats=5):
    """Float32 (n x n) @ (n x n) GFLOP/s through NumPy's BLAS: the best of ``repeats``."""
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    a @ a
    best = min(once(lambda: a @ a) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _blas():
    """threadpoolctl's description of the BLAS (kernel, threads)."""
    from threadpoolctl import threadpool_info
    return [{**{key: info.get(key) for key in ("internal_api", "version", "architecture",
                                                "num_threads", "threading_layer")},
             "package": _package(info.get("filepath") or "")}
            for info in threadpool_info() if info.get("user_api") == "blas"]


def _package(filepath):
    """The package that ships a library, from its path: ``.../site-packages/numpy.libs/x.so``
    gives "numpy" (NumPy and SciPy each load their own OpenBLAS; Numba's products call
    SciPy's); None outside site-packages."""
    parts = pathlib.PurePath(filepath).parts
    for folder, name in zip(parts, parts[1:]):
        if folder in ("site-packages", "dist-packages"):
            return name.removesuffix(".libs")
    return None


def blas_label(entry):
    """One BLAS of ``machine()["blas"]`` in words: "openblas 0.3.31 (Haswell) of numpy"."""
    label = f"{entry.get('internal_api')} {entry.get('version')} ({entry.get('architecture')})"
    return label + (f" of {entry['package']}" if entry.get("package") else "")


# the OpenBLAS variables ``machine`` records (the performance page names them)
OPENBLAS_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS")


def machine():
    """A JSON-ready description of this machine and the libraries the numbers depend on."""
    import numba

    from .. import isa        # here: the peers' script imports this module as a top-level one
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": _cpu_model(),
        "cores_available": cores,
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "numba": numba.__version__,
        "numba_threads": numba.get_num_threads(),
        "numba_threading_layer": _threading_layer(numba),
        "blas": _blas(),
        "openblas_env": {k: os.environ[k] for k in OPENBLAS_VARIABLES if k in os.environ},
        "instruction_set": isa.describe(),
        "kernel_sizes": kernel_sizes(),
        "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


def kernel_sizes(d=64):
    """The sizes the Numba kernels take from SciPy's BLAS kernel, at N = 4096, D = M = ``d``,
    on this thread: the softmax tiles (B, C) as ``softmax.planned_tiles`` yields them,
    whether the BLAS was held to one thread while they would run (``blas_threads.holding``:
    by this plan, or by a hold already in place), and the causal linear kernel's block length
    (``numba_cpu.blas_threads``)."""
    from ...numba_cpu import blas_threads, chunked, softmax

    with softmax.planned_tiles(4096, 4096, d, d) as tiles:
        held = blas_threads.holding()
    return {"blas_kernel": blas_threads.kernel(), "d": d, "softmax_tiles": list(tiles),
            "blas_held": held,
            "chunk_size": chunked.block_length(chunked.default_chunk_size(), d, d)}


def _threading_layer(numba):
    try:
        return numba.threading_layer()
    except ValueError:  # no parallel function has run yet
        return None
