"""The CuPy backend on a machine without a GPU: every CUDA source compiles with nvcc for sm_80
and sm_90, every kernel launch from Python matches its kernel's parameter list, and asking for
backend="cupy" without CuPy, without a GPU or with NumPy arrays is a clear error."""
import re
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

from linattn import (linear_attention, linear_attention_backward, linear_attention_step,
                     softmax_attention, softmax_attention_backward)
from linattn.cuda import chunked, cumulative, launch, softmax, step
from linattn.forms.recurrent import zero_state

from helpers import random_qkv

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
slow = pytest.mark.slow                      # nvcc builds


def nvcc(source, dtype, *flags):
    """Compile ``source`` with the options CuPy compiles it with (the package's own and CuPy's
    -ftz=true); return nvcc's stderr."""
    done = subprocess.run([NVCC, *launch.options(dtype), *launch.CUPY_ADDS, *flags,
                           str(launch.source_path(source))],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_sources_lists_every_cu_file():
    found = sorted(p.name for p in launch.source_path("x").parent.glob("*.cu"))
    assert sorted(launch.SOURCES) == found


@slow
@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("source", launch.SOURCES)
def test_sources_compile(source, arch, tmp_path):
    # PTX, then ptxas: also catches shared memory or registers over the architecture's limits
    for dtype in (np.float32, np.float64):
        log = nvcc(source, dtype, f"-arch={arch}", "-cubin", "-Xptxas", "-v",
                   "-o", str(tmp_path / "out.cubin"))
        assert "error" not in log.lower() and "Compiling entry function" in log


@pytest.fixture(scope="module")
def ptx_signatures(tmp_path_factory):
    """{(source, dtype): {kernel: [PTX parameter types]}}, from nvcc's PTX for sm_80."""
    tmp = tmp_path_factory.mktemp("ptx")
    found = {}
    for source in launch.SOURCES:
        for dtype in (np.float32, np.float64):
            path = tmp / f"{source}.{np.dtype(dtype).name}.ptx"
            nvcc(source, dtype, "-arch=sm_80", "-ptx", "-o", str(path))
            entries = re.findall(r"\.entry (\w+)\(([^)]*)\)", path.read_text())
            found[source, np.dtype(dtype)] = {
                name: re.findall(r"\.param \.(\w+)", params) for name, params in entries}
    return found


def entry(ptx, name):
    """The PTX body of kernel ``name``."""
    body = ptx.split(f".entry {name}(", 1)[1]
    return body.split(".entry ", 1)[0]


@slow
@needs_nvcc
def test_compensated_step_is_explicitly_rounded(tmp_path):
    # every multiply, add and subtract of Kahan's compensation is its own rounded instruction
    # (an fma appears only in the readout): float32 ones carry .ftz under CuPy's -ftz=true,
    # so float32 subnormals flush; float64 ones never do
    for dtype, suffix in ((np.float32, ".rn.ftz.f32"), (np.float64, ".rn.f64")):
        path = tmp_path / f"rnn_step.{np.dtype(dtype).name}.ptx"
        nvcc("rnn_step.cu", dtype, "-arch=sm_90", "-ptx", "-o", str(path))
        body = entry(path.read_text(), "rnn_step_compensated")
        for op in ("mul", "sub"):
            found = re.findall(rf"\b{op}(\.[\w.]*f(?:32|64))\s", body)
            assert found and set(found) == {suffix}, (dtype, op, set(found))
        plain = entry(path.read_text(), "rnn_step")
        assert f"sub{suffix}" not in plain and f"mul{suffix}" not in plain


def test_kernels_are_looked_up_once_per_process(monkeypatch):
    # a per-token Recurrence.step launches the same kernels again and again: one RawModule per
    # source and dtype, one get_function per kernel, dtype and device
    built, looked_up = [], []

    class RawModule:
        def __init__(self, code, options):
            built.append(options)

        def get_function(self, name):
            looked_up.append(name)
            return object()
    device = [0]
    cupy = fake_cupy(2)
    cupy.RawModule = RawModule
    cupy.cuda.runtime.getDevice = lambda: device[0]
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    launch._module.cache_clear()
    launch._kernel.cache_clear()
    try:
        first = launch.kernel("rnn_step.cu", "rnn_step", np.float32)
        for _ in range(3):
            assert launch.kernel("rnn_step.cu", "rnn_step", np.dtype("float32")) is first
            launch.kernel("rnn_step.cu", "rnn_step_compensated", np.float32)
            launch.kernel("rnn_step.cu", "rnn_step", np.float64)
        assert built == [launch.options(np.float32), launch.options(np.float64)]
        assert looked_up == ["rnn_step", "rnn_step_compensated", "rnn_step"]
        device[0] = 1                               # another GPU: loaded there once more
        assert launch.kernel("rnn_step.cu", "rnn_step", np.float32) is not first
        assert len(built) == 2 and len(looked_up) == 4
    finally:
        launch._module.cache_clear()
        launch._kernel.cache_clear()


PTX_TYPE = {np.int32: "u32", np.int64: "u64", np.float32: "f32", np.float64: "f64"}


def dry_run(monkeypatch, signatures):
    """Replace compiled kernels by recorders that check each launch against the PTX entry:
    the Python side then runs on NumPy arrays (the kernels' outputs are left unwritten)."""
    launched = []

    def kernel(source, function, dtype):
        def run(grid, block, args):
            want = signatures[source, np.dtype(dtype)][function]
            got = ["u64" if a is None or isinstance(a, np.ndarray) else PTX_TYPE[type(a)]
                   for a in args]
            assert got == want, f"{function}: launched with {got}, the kernel takes {want}"
            for a in args:
                if isinstance(a, np.ndarray):
                    assert a.dtype == dtype and a.flags.c_contiguous, function
            assert block == (launch.THREADS,) and 0 < grid[0] < 2**31
            assert all(0 < g < 2**16 for g in grid[1:]), (function, grid)
            launched.append(function)
        return run

    monkeypatch.setattr(launch, "kernel", kernel)
    return launched


@slow
@needs_nvcc
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n, d, m", [(1, 1, 1), (70, 3, 2), (130, 65, 70)])
def test_every_launch_matches_its_kernel(monkeypatch, ptx_signatures, dtype, n, d, m):
    launched = dry_run(monkeypatch, ptx_signatures)
    q, k, v = (np.abs(x).astype(dtype) for x in random_qkv(0, n, d, m, (2,)))
    with np.errstate(all="ignore"):                    # unwritten outputs hold anything
        for form in (cumulative, chunked):
            form.attend(q, k, v, causal=True, eps=1e-6)
            form.attend_backward(v, q, k, v, causal=True, eps=1e-6)
        softmax.attend(q, k, v, causal=True, scale=0.5)
        softmax.attend_backward(v, q, k, v, causal=False, scale=0.5)
        step.step(q[:, 0], k[:, 0], v[:, 0], zero_state((2,), d, m, dtype, np), 1e-6)
        out = np.empty((2, m), dtype)
        step.step_into(q[:, 0], k[:, 0], v[:, 0], *zero_state((2,), d, m, dtype, np), out,
                       1e-6)
        step.step_into_compensated(q[:, 0], k[:, 0], v[:, 0],
                                   *zero_state((2,), d, m, dtype, np, True), out, 1e-6)
    assert set(launched) == {name for sigs in ptx_signatures.values() for name in sigs}


def numpy_inputs():
    q, k, v = random_qkv(1, 6, 3, 2)
    return [
        lambda backend: linear_attention(q, k, v, causal=True, backend=backend),
        lambda backend: linear_attention_backward(v, q, k, v, backend=backend),
        lambda backend: softmax_attention(q, k, v, backend=backend),
        lambda backend: softmax_attention_backward(v, q, k, v, causal=True, backend=backend),
        lambda backend: linear_attention_step(q[0], k[0], v[0], backend=backend),
    ]


def fake_cupy(device_count):
    """A stand-in CuPy module: importable, with ``device_count`` GPUs (or a CUDA error)."""
    def count():
        if isinstance(device_count, Exception):
            raise device_count
        return device_count
    runtime = types.SimpleNamespace(getDeviceCount=count)
    return types.SimpleNamespace(__name__="cupy", ndarray=type("ndarray", (), {}),
                                 cuda=types.SimpleNamespace(runtime=runtime))


@pytest.mark.parametrize("module, error, message", [
    (None, ImportError, "needs CuPy, which is not installed"),
    (fake_cupy(RuntimeError("cudaErrorNoDevice")), RuntimeError, "needs an NVIDIA GPU.*NoDevice"),
    (fake_cupy(0), RuntimeError, "needs an NVIDIA GPU"),
    (fake_cupy(1), TypeError, "takes CuPy arrays, got NumPy arrays"),
])
@pytest.mark.parametrize("call", range(5))
def test_cupy_backend_says_what_is_missing(monkeypatch, module, error, message, call):
    monkeypatch.setitem(sys.modules, "cupy", module)
    with pytest.raises(error, match=message):
        numpy_inputs()[call]("cupy")


@pytest.mark.parametrize("call", range(5))
def test_auto_backend_stays_on_the_cpu_without_cupy(monkeypatch, call):
    monkeypatch.setitem(sys.modules, "cupy", None)
    out = numpy_inputs()[call]("auto")
    assert isinstance(out if isinstance(out, np.ndarray) else out[0], np.ndarray)


def test_this_machine_gets_one_of_the_clear_errors():
    # whatever is installed here: no CuPy, CuPy without a GPU, or CuPy with one
    with pytest.raises((ImportError, RuntimeError, TypeError),
                       match="needs CuPy|needs an NVIDIA GPU|takes CuPy arrays"):
        numpy_inputs()[0]("cupy")
