"""The first compile is announced: one line on stderr while a kernel compiles with a cold
disk cache, nothing when the cache is warm."""
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("numba")
from numba.core import types  # noqa: E402

from linattn.numba_cpu.compile_notice import FirstCompile  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE = ("import numpy as np, linattn\n"
        "q = np.ones((2, 8), np.float32)\n"
        "linattn.linear_attention_step(q, q, q, backend='numba')\n"
        "linattn.linear_attention_step(q, q, q, backend='numba')\n")


def _event(module):
    return SimpleNamespace(data={"dispatcher": SimpleNamespace(py_func=SimpleNamespace(
        __module__=module)), "args": (types.float32[:, :], types.int64)})


def test_the_outermost_compile_prints_once_per_family(capsys):
    listener = FirstCompile()
    for module in ("linattn.numba_cpu.step", "linattn.numba_cpu.elu"):   # elu: nested
        listener.on_start(_event(module))
    listener.on_end(None), listener.on_end(None)
    listener.on_start(_event("linattn.numba_cpu.step")), listener.on_end(None)  # told already
    listener.on_start(_event("somebody.else")), listener.on_end(None)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RNN step" in err and "float32" in err


@pytest.mark.slow
def test_a_cold_cache_prints_one_line_and_a_warm_one_none(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT, "NUMBA_CACHE_DIR": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                           env=env, timeout=600) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    cold, warm = (r.stderr for r in runs)
    assert cold.count("compiling the Numba kernels") == 1, cold
    assert "RNN step" in cold and "float32" in cold
    assert "compiling" not in warm, warm
