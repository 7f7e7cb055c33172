"""The AVX2 mode of the benchmarks: the environment it sets reaches Numba's compiler."""
import json
import subprocess
import sys

import pytest

from linattn.lab import isa

# a vectorisable loop: on an AVX-512 target LLVM uses zmm registers for it, on Haswell ymm
_PROBE = """
import json, numpy as np, numba
from linattn.lab import isa
@numba.njit
def axpy(a, x, y):
    for i in range(x.size):
        y[i] += a * x[i]
x = np.ones(1024, np.float32)
axpy(np.float32(2), x, x.copy())
asm = next(iter(axpy.inspect_asm().values()))
print(json.dumps({"described": isa.describe(), "zmm": "zmm" in asm, "ymm": "ymm" in asm}))
"""


def _probe(mode, tmp_path):
    env = isa.environment(mode)
    env["NUMBA_CACHE_DIR"] = str(tmp_path)          # nothing from the other mode's cache
    run = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(run.stdout)


@pytest.mark.skipif("avx2" not in isa.cpu_flags(), reason="the CPU has no AVX2")
def test_avx2_mode_compiles_without_avx512(tmp_path):
    result = _probe("avx2", tmp_path)
    assert result["described"]["mode"] == "avx2"
    assert result["described"]["numba_cpu"] == "haswell"
    assert not result["described"]["numba_avx512"]
    assert result["ymm"] and not result["zmm"]


@pytest.mark.skipif("avx512f" not in isa.cpu_flags(), reason="the CPU has no AVX-512")
def test_native_mode_on_an_avx512_cpu_uses_it(tmp_path):
    """The control: without the mode Numba's target has AVX-512, so the test above can tell
    the two apart. (Whether LLVM then uses 512-bit registers for this loop depends on the
    CPU's tuning: Skylake-X prefers 256-bit ones.)"""
    result = _probe("native", tmp_path)
    assert result["described"]["mode"] == "native" and result["described"]["numba_avx512"]


def test_environment_sets_and_clears_the_variables():
    forced = isa.environment("avx2", {"PATH": "/bin"})
    assert isa.mode(forced) == "avx2" and forced["PATH"] == "/bin"
    assert isa.mode(isa.environment("native", forced)) == "native"
    assert not set(isa.AVX2_ENVIRONMENT) & set(isa.environment("native", forced))
    with pytest.raises(ValueError, match="unknown instruction-set mode 'sse'"):
        isa.environment("sse")


def test_label_names_the_mode():
    assert isa.label({"mode": "avx2", "numba_cpu": "haswell",
                      "openblas_coretype": "Haswell"}).startswith("AVX2 mode")
    assert "with AVX-512" in isa.label({"mode": "native", "numba_cpu": "znver4",
                                        "numba_avx512": True})


def test_the_avx2_mode_adds_a_measurement_only_on_an_avx512_cpu():
    """On a CPU whose widest vectors are AVX2's the native run is the AVX2 run; a CPU
    without AVX2 (an ARM one: no flags) cannot run the mode's code."""
    assert isa.avx2_mode_adds(("avx512f", "avx2", "fma", "avx"))
    assert not isa.avx2_mode_adds(("avx2", "fma", "avx"))
    assert not isa.avx2_mode_adds(())
    assert isa.avx2_mode_adds() == ("avx512f" in isa.cpu_flags())
