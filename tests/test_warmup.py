"""``linattn.warmup``: every kernel of a family is compiled by it, and bad arguments are refused."""
import numpy as np
import pytest

pytest.importorskip("numba")
from numba.core.registry import CPUDispatcher  # noqa: E402

from linattn.numba_cpu import softmax as numba_softmax  # noqa: E402
from linattn.warmup import warmup  # noqa: E402


def _kernels(module):
    """The module's compiled entry points (its njit functions; inlined helpers included)."""
    return {name: f for name, f in vars(module).items() if isinstance(f, CPUDispatcher)}


def test_softmax_family_compiles_serial_and_parallel_kernels():
    """Both sides of the tiles' size threshold: the serial and the threaded kernels, forward,
    backward and the backward's row dots, each gets a float64 signature."""
    warmup(dtypes=("float64",), causal=(True, False), families=("softmax",))
    wanted = ("_forward", "_forward_serial", "_backward", "_backward_serial", "_row_dots",
              "_row_dots_serial")
    kernels = _kernels(numba_softmax)
    assert set(wanted) <= set(kernels)
    for name in wanted:
        types = [str(t) for sig in kernels[name].signatures for t in sig]
        assert any("float64" in t for t in types), (name, kernels[name].signatures)


@pytest.mark.parametrize("kwargs, error", [
    ({"dtypes": ("float16",)}, ValueError),
    ({"dtypes": "float32"}, ValueError),                     # a string, not a sequence
    ({"families": ("rnn",)}, ValueError),
    ({"causal": (1,)}, TypeError),
])
def test_bad_arguments_are_refused(kwargs, error):
    with pytest.raises(error):
        warmup(**kwargs)


def test_returns_seconds_per_family_and_dtype():
    seconds = warmup(dtypes=("float32",), causal=(np.bool_(True),), families=("step",))
    assert set(seconds) == {("step", "float32")} and seconds["step", "float32"] >= 0
