"""``linattn.warmup``: the softmax family's serial and threaded kernels are compiled by it
(the others are called the same way), and bad arguments are refused."""
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("numba")
from linattn.warmup import warmup  # noqa: E402

# run in a fresh process: in this one, other tests may already have compiled the kernels
CHECK = """
from numba.core.registry import CPUDispatcher
from linattn.numba_cpu import softmax
from linattn.warmup import warmup
warmup(dtypes=("float64",), causal=(True, False), families=("softmax",))
for name, f in sorted(vars(softmax).items()):
    if isinstance(f, CPUDispatcher):
        print(name, any("float64" in str(t) for sig in f.signatures for t in sig))
"""


def test_softmax_family_compiles_serial_and_parallel_kernels():
    """Both sides of the tiles' size threshold: the serial and the threaded kernels, forward,
    backward and the backward's row dots, each gets a float64 signature in a process that
    ran nothing but ``warmup``."""
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                          timeout=900, check=True)
    compiled = dict(line.split() for line in done.stdout.splitlines())
    for name in ("_forward", "_forward_serial", "_backward", "_backward_serial", "_row_dots",
                 "_row_dots_serial"):
        assert compiled.get(name) == "True", (name, done.stdout)


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
