"""linattn._environment: the thread settings made at import, and the environment the peers'
subprocesses get back."""
import os
import subprocess
import sys

import pytest

from linattn import _environment


@pytest.mark.parametrize("before", [None, "ACTIVE"])
def test_user_environment_is_the_environment_before_our_settings(monkeypatch, before):
    """The peers' subprocesses get OpenMP's wait policy and OpenBLAS's timeout as the user
    had them, not ours; extra variables pass through."""
    monkeypatch.setattr(_environment, "BEFORE", {"OMP_WAIT_POLICY": before,
                                                 "GOMP_SPINCOUNT": None,
                                                 "OPENBLAS_THREAD_TIMEOUT": None})
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "20")
    env = _environment.user_environment(EXTRA="1")
    assert env.get("OMP_WAIT_POLICY") == before
    assert "OPENBLAS_THREAD_TIMEOUT" not in env and "GOMP_SPINCOUNT" not in env
    assert env["EXTRA"] == "1" and env["PATH"] == os.environ["PATH"]
    # an extra variable of the same name is what the caller asked for
    assert _environment.user_environment(OMP_WAIT_POLICY="X")["OMP_WAIT_POLICY"] == "X"


def _fresh_python(code, **env):
    base = {k: v for k, v in os.environ.items() if k not in _environment.SETTINGS}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**base, **env}, check=True)
    return run.stdout.split()


def test_import_sets_the_defaults_before_numpy_loads():
    """``import linattn`` first: both settings are made, and OpenBLAS will read its timeout."""
    out = _fresh_python("import os, linattn; from linattn import _environment as e; "
                        "print(os.environ['OMP_WAIT_POLICY'], os.environ['GOMP_SPINCOUNT'], "
                        "os.environ['OPENBLAS_THREAD_TIMEOUT'], e.BLAS_TIMEOUT_APPLIES)")
    assert out == ["PASSIVE", "10000", "20", "True"]


def test_import_keeps_what_the_user_set_and_knows_when_numpy_came_first():
    """A user's wait policy keeps OpenMP's spin as that policy sets it (no GOMP_SPINCOUNT)."""
    out = _fresh_python("import numpy, os, linattn; from linattn import _environment as e; "
                        "print(os.environ['OMP_WAIT_POLICY'], "
                        "os.environ.get('GOMP_SPINCOUNT', '-'), "
                        "os.environ['OPENBLAS_THREAD_TIMEOUT'], e.BLAS_TIMEOUT_APPLIES)",
                        OMP_WAIT_POLICY="ACTIVE", OPENBLAS_THREAD_TIMEOUT="28")
    assert out == ["ACTIVE", "-", "28", "False"]


def test_keep_freed_memory_stops_the_page_faults_of_fresh_arrays():
    """A step's worth of 8 MB arrays allocated, written and freed, ten times: glibc returns
    the freed top of its heap to the system and faults the pages back in each time (2048
    pages an array); after ``keep_freed_memory`` the pages are reused (glibc only; elsewhere
    it says it did nothing)."""
    code = """
import resource, numpy as np
from linattn.model import keep_freed_memory
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        arrays = [np.ones(1 << 21, np.float32) for _ in range(8)]    # 8 x 8 MB, written
        del arrays
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults()                                        # glibc's own threshold settles first
plain = faults()
applied = keep_freed_memory()
faults()
print(plain, faults() if applied else -1, applied)
"""
    plain, kept, applied = _fresh_python(code)
    if applied != "True":
        pytest.skip("no glibc mallopt here")
    assert int(plain) > 10 * 2048 and int(kept) < int(plain) // 10
