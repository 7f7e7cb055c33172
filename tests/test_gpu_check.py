"""linattn/lab/gpu_check.sh, the one call a lent GPU gets, checked on the CPU: its steps' limits
add up to under 480 s, each step has its own limit and log, only tests/test_cuda.py is
collected, and a dry run (no GPU, or GPU_CHECK_DRY_RUN=1) skips every GPU step with a line and
exits 0 after checking each step's command parses."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "linattn" / "lab" / "gpu_check.sh"
BUDGET_S = 480          # the device's time for the whole check, a fresh machine's compiles in
STEPS = ("device", "warmup", "tests", "memcheck", "racecheck", "synccheck", "bench")
needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not on the PATH")


def limits():
    """{step: its timeout in seconds}, from the script's ``step NAME LIMIT ...`` lines."""
    found = re.findall(r"^\s*step (\w+) (\d+) ", SCRIPT.read_text(), re.MULTILINE)
    return {name: int(limit) for name, limit in found}


def test_limits_add_up_to_under_the_budget():
    steps = limits()
    assert list(steps) == list(STEPS)                   # the benchmark last
    assert all(limit > 0 for limit in steps.values())
    assert sum(steps.values()) < BUDGET_S, steps


def test_every_timeout_is_a_steps_own():
    text = SCRIPT.read_text()
    # the one `timeout` is step()'s, with its step's limit; no other limit, no trimmed log
    found = re.findall(r"^[^#\n]*\btimeout\b.*", text, re.MULTILINE)
    assert [line.strip() for line in found] == [
        'timeout -k 5 "$limit" bash -c "$command" 2>&1 | tee -a "$out/$name.log"']
    assert "tail" not in text


def test_the_checks_are_the_ones_the_device_needs():
    text = SCRIPT.read_text()
    assert "pytest tests/test_cuda.py -m gpu" in text    # one module collected, not the tree
    assert "cp.cuda.set_allocator(None)" in text         # memcheck sees each array's bounds
    assert "--kernel-name kns=$name" in text             # our kernels, no library kernel
    assert "(cp.float32, cp.float64)" in text and "compensated=compensated" in text
    substrings = re.search(r"GPU_CHECK_KERNELS='([^']*)'", text).group(1).split()
    assert sorted(substrings) == ["chunk_", "rnn_step", "scan_product", "softmax_rows"]
    assert "rnn_step_probe" in text                      # the control is a kernel filtered in
    # each filter is a substring match (kns=), not a regular expression: every kernel in the
    # CUDA sources must contain one, or the sanitizers would skip it and report nothing
    for source in (ROOT / "linattn" / "cuda").glob("*.cu"):
        for kernel in re.findall(r"__global__ void(?: __launch_bounds__\(\w+\))?\s+(\w+)\(",
                                 source.read_text()):
            assert any(s in kernel for s in substrings), (source.name, kernel)


def run(tmp_path, **env):
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path)], capture_output=True, text=True,
                          check=False, env={**os.environ, "PYTHON": sys.executable, **env}, timeout=120)
    return done


@needs_bash
def test_dry_run_skips_every_step(tmp_path):
    done = run(tmp_path, GPU_CHECK_DRY_RUN="1")
    assert done.returncode == 0, done.stdout + done.stderr
    for name in STEPS:
        line = f"== {name}: skipped, dry run (GPU_CHECK_DRY_RUN=1)"
        assert line in done.stdout
        assert (tmp_path / f"{name}.log").read_text().strip() == line
        assert re.search(rf"^{name} +skipped +0$", (tmp_path / "summary.txt").read_text(),
                         re.MULTILINE)


@needs_bash
@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU")
def test_without_a_gpu_it_skips_by_itself(tmp_path):
    done = run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("skipped, no NVIDIA GPU") == len(STEPS)


@needs_bash
def test_a_broken_step_fails_the_dry_run(tmp_path):
    # the dry run parses each step's command: a syntax error there is an error, not a skip
    broken = tmp_path / "linattn" / "lab" / "gpu_check.sh"
    broken.parent.mkdir(parents=True)
    broken.write_text(SCRIPT.read_text().replace('step synccheck 30 "$(sanitize synccheck)"',
                                                 'step synccheck 30 "if then"'))
    done = subprocess.run(["bash", str(broken), str(tmp_path / "out")], capture_output=True,
                          text=True, check=False, env={**os.environ, "PYTHON": sys.executable,
                                          "GPU_CHECK_DRY_RUN": "1"}, timeout=120)
    assert done.returncode == 1
    assert re.search(r"^synccheck +syntax", (tmp_path / "out" / "summary.txt").read_text(),
                     re.MULTILINE)
