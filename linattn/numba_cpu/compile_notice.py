"""One line on stderr while Numba compiles: the first call of a kernel in a fresh process on a
machine whose disk cache does not hold it yet sits silent for seconds to a minute (how long
depends on the machine and the kernels), and the user cannot tell a compile from a hang.

    linattn: compiling the Numba kernels of linear attention (blocks of positions) for
    float32, once; later runs load them from Numba's disk cache

Every kernel is ``@njit(cache=True)``: a call first looks in the disk cache, and only a miss
compiles. Numba announces each real compile as a ``"numba:compile"`` event (its documented
event API, ``numba.core.event``; a load from the cache is no compile and sends none), with the
dispatcher that compiles and its argument types. ``listen`` registers one listener for those
events; it prints for the outermost compile only (a kernel compiles the kernels it calls
inside its own event), once per family and dtype per process: a warm cache prints nothing.
``linattn.numba_cpu`` calls ``listen`` when it is first imported, which is when the first
Numba kernel is about to run (``import linattn`` imports no kernel).
"""
import sys

from numba.core import event

# kernel module (the last part of its name) -> what its kernels compute, for the message
FAMILIES = {
    "chunked": "linear attention (blocks of positions)",
    "block_ops": "linear attention (blocks of positions)",
    "quadratic": "linear attention (blocks of the kernel matrix)",
    "products": "linear attention (running sums)",
    "normaliser": "linear attention (running sums)",
    "loops": "linear attention (running sums)",
    "step": "the RNN step of linear attention",
    "softmax": "softmax attention",
    "flash_tiles": "softmax attention",
    "lsh": "LSH attention",
    "lsh_hash": "LSH attention",
    "lsh_windows": "LSH attention",
    "decode": "the model's generation step",
    "elu": "the elu+1 feature map",
    "blas": "matrix products",
}


class FirstCompile(event.Listener):
    """Prints one line when an outermost compile of a linattn kernel starts, once per
    (family, dtype); ``told`` holds the ones printed, ``depth`` the compiles under way."""

    def __init__(self, stream=None):
        self.told, self.depth, self.stream = set(), 0, stream

    def on_start(self, ev):
        self.depth += 1
        if self.depth > 1:                    # a kernel the outer one calls: told already
            return
        family, dtype = describe(ev.data["dispatcher"], ev.data["args"])
        if family is None or (family, dtype) in self.told or (
                not dtype and any(f == family for f, _ in self.told)):
            return
        self.told.add((family, dtype))
        print(f"linattn: compiling the Numba kernels of {family}{' for ' + dtype if dtype else ''}"
              f", once; later runs load them from Numba's disk cache",
              file=self.stream or sys.stderr, flush=True)

    def on_end(self, ev):
        self.depth -= 1


def describe(dispatcher, args):
    """(family, dtype) of a compile of ``dispatcher`` on argument types ``args``: what its
    kernels compute and the float dtype of its first float array ("" if none); (None, None)
    for a function that is not one of linattn's kernels."""
    module = getattr(dispatcher.py_func, "__module__", "") or ""
    if not module.startswith("linattn."):
        return None, None
    family = FAMILIES.get(module.rsplit(".", 1)[-1], module)
    dtypes = [str(a.dtype) for a in args if hasattr(a, "dtype") and hasattr(a, "ndim")]
    return family, next((d for d in dtypes if d.startswith("float")), "")


_LISTENER = []      # the one listener of this process, once ``listen`` has registered it


def listen():
    """Register the listener (once per process; later calls do nothing). Returns it."""
    if not _LISTENER:
        _LISTENER.append(FirstCompile())
        event.register("numba:compile", _LISTENER[0])
    return _LISTENER[0]
