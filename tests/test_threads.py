"""linattn.threads: the thread settings an entry point opts into, and the environment the
peers' subprocesses get back."""
import os
import subprocess
import sys

import pytest

from linattn import threads

OURS = (*threads.SETTINGS, threads.ADDED)


@pytest.fixture
def clean(monkeypatch):
    for name in OURS:
        monkeypatch.delenv(name, raising=False)


def test_recommended_is_what_the_environment_lacks(clean, monkeypatch):
    assert threads.recommended_environment() == threads.SETTINGS
    # a user's OpenMP policy keeps the spin it implies: neither OpenMP variable is added
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert threads.recommended_environment() == {"OPENBLAS_THREAD_TIMEOUT": "20"}
    assert threads.recommended_environment({"GOMP_SPINCOUNT": "1"}) == {
        "OPENBLAS_THREAD_TIMEOUT": "20"}


def test_configure_sets_only_what_was_missing_and_peers_get_the_user_environment(
        clean, monkeypatch):
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "28")            # the user's own
    added = threads.configure()
    assert added == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000"}
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert os.environ["OPENBLAS_THREAD_TIMEOUT"] == "28"
    assert threads.configure() == {}                                  # idempotent
    env = threads.user_environment(EXTRA="1")
    assert "OMP_WAIT_POLICY" not in env and "GOMP_SPINCOUNT" not in env
    assert env["OPENBLAS_THREAD_TIMEOUT"] == "28" and env["EXTRA"] == "1"
    assert threads.ADDED not in env and env["PATH"] == os.environ["PATH"]
    assert threads.user_environment(OMP_WAIT_POLICY="X")["OMP_WAIT_POLICY"] == "X"


def _fresh(args, **env):
    base = {k: v for k, v in os.environ.items() if k not in OURS}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          env={**base, **env}, check=True).stdout


def test_an_entry_point_relaunches_once_with_the_settings():
    """``relaunch_configured`` at an entry point: the program runs (once) with OpenBLAS's
    timeout in its environment from the start."""
    code = ("import os, sys; from linattn import threads; threads.relaunch_configured(); "
            "print(os.environ['OPENBLAS_THREAD_TIMEOUT'], os.environ['OMP_WAIT_POLICY'], "
            "sys.argv[1:])")
    assert _fresh(["-c", code, "x"]).split() == ["20", "PASSIVE", "['x']"]
    assert _fresh(["-m", "linattn.threads"]).split() == [
        f"{k}={v}" for k, v in threads.SETTINGS.items()]


def test_keep_freed_memory_stops_the_page_faults_of_fresh_arrays():
    """A step's worth of 8 MB arrays allocated, written and freed, ten times: glibc returns
    the freed top of its heap to the system and faults the pages back in each time (2048
    pages an array); after ``keep_freed_memory`` the pages are reused (glibc only; elsewhere
    it says it did nothing)."""
    code = """
import resource, numpy as np
from linattn.threads import keep_freed_memory
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
    plain, kept, applied = _fresh(["-c", code]).split()
    if applied != "True":
        pytest.skip("no glibc mallopt here")
    assert int(plain) > 10 * 2048 and int(kept) < int(plain) // 10
