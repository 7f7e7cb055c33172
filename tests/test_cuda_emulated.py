"""The CUDA kernels, run on the CPU: every linattn/cuda/*.cu file compiled by g++ with
tests/cuda_emulator.h (one thread per CUDA thread, checked barriers for __syncthreads), launched
by the package's own Python code on NumPy arrays, and held to the NumPy oracle.

Two builds, every test run on each (``variant``):
- "exact": -ffp-contract=off, every operator rounds once, as NumPy does;
- "device": as CuPy compiles for the GPU: multiply-adds contracted into FMA instructions
  (-ffp-contract=fast) and float32 subnormals flushed to zero (-ftz=true, emulated by the
  CPU's flush-to-zero mode in the worker threads). The comparisons then allow what the GPU
  tests allow (test_cuda.TOLERANCE), and the compensated step is still bit for bit.

This checks the kernels' arithmetic, indexing and chunk edges on every machine; the GPU tests
(test_cuda.py) check the same on a device. Skips where g++ is missing."""
import ctypes
import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from linattn.cuda import chunked, cumulative, launch, softmax, step
from linattn.feature_maps import get_feature_map
from linattn import State
from linattn.forms import chunked as numpy_chunked, recurrent
from linattn.softmax import softmax_attention, softmax_attention_backward

from helpers import random_qkv
from test_cuda import assert_close, kahan_add_flushed_, subnormal_steps

GXX = shutil.which("g++")
pytestmark = [
    pytest.mark.slow,                       # g++ builds the emulated kernels
    pytest.mark.skipif(GXX is None, reason="g++ is not on the PATH"),
    pytest.mark.skipif(platform.system() != "Linux"
                       or platform.machine() not in ("x86_64", "aarch64"),
                       reason="the emulator's launch relies on the Linux x86-64/AArch64 ABI"),
]
SLOTS = 16                  # integer-class argument slots of emulate_launch
HEADER = Path(__file__).with_name("cuda_emulator.h")


def has_fma():
    """Whether this CPU has fused multiply-add instructions (AArch64 always does)."""
    if platform.machine() == "aarch64":
        return True
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.exists() and " fma" in cpuinfo.read_text()


def flags(variant):
    """g++ flags of an emulator build: "exact" rounds every operator; "device" contracts and
    flushes as CuPy's build for the GPU does."""
    if variant == "exact":
        return ["-O1", "-ffp-contract=off"]
    isa = ["-mfma"] if platform.machine() == "x86_64" else []
    # -O2: GCC contracts a * b + c into an fma only at -O2 and above
    return ["-O2", "-ffp-contract=fast", "-DLINATTN_EMULATE_FTZ", *isa]


def build(source, dtype, variant, path):
    """Compile ``source`` (a path) for the CPU with the emulator header; a ctypes library."""
    real = launch.options(dtype)[-1]                                # -DLINATTN_REAL=...
    done = subprocess.run([GXX, "-std=c++20", *flags(variant), "-shared", "-fPIC", "-pthread",
                           "-Wno-unknown-pragmas", real, "-include", str(HEADER), "-x", "c++",
                           str(source), "-o", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lib = ctypes.CDLL(str(path))
    lib.emulate_failure.restype = ctypes.c_char_p
    return lib


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    """libraries(variant) -> {(source, dtype): ctypes library}, each built once."""
    tmp, built = tmp_path_factory.mktemp("emulated"), {}

    def get(variant):
        if variant not in built:
            built[variant] = {
                (source, np.dtype(dtype)): build(
                    launch.source_path(source), dtype, variant,
                    tmp / f"{source}.{np.dtype(dtype).name}.{variant}.so")
                for source in launch.SOURCES for dtype in (np.float32, np.float64)}
        return built[variant]
    return get


def run_kernel(lib, function, dtype, grid, block, args):
    """Launch ``function`` of ``lib`` as CuPy would; fail with the emulator's message."""
    ints = [0 if a is None else a.ctypes.data if isinstance(a, np.ndarray) else int(a)
            for a in args if not isinstance(a, (np.float32, np.float64))]
    reals = [float(a) for a in args if isinstance(a, (np.float32, np.float64))]
    assert len(ints) <= SLOTS and len(reals) <= 1
    entry = ctypes.cast(getattr(lib, function), ctypes.c_void_p)
    failed = lib.emulate_launch(*(ctypes.c_uint(g) for g in (*grid, 1, 1)[:3]),
                                ctypes.c_uint(block[0]), entry,
                                (ctypes.c_longlong * SLOTS)(*ints),
                                ctypes.c_double(reals[0] if reals else 0.0),
                                ctypes.c_int(np.dtype(dtype) == np.float32))
    assert not failed, f"{function}: {lib.emulate_failure().decode()}"


@pytest.fixture(params=["exact", "device"])
def variant(request):
    if request.param == "device" and not has_fma():
        pytest.skip("this CPU has no FMA instructions to contract into")
    return request.param


@pytest.fixture
def emulated(monkeypatch, libraries, variant):
    """Route the package's kernel launches to the CPU builds of ``variant``; the variant."""
    libs = libraries(variant)

    def kernel(source, function, dtype):
        lib = libs[source, np.dtype(dtype)]
        return lambda grid, block, args: run_kernel(lib, function, dtype, grid, block, args)

    monkeypatch.setattr(launch, "kernel", kernel)
    return variant


def features(seed, n, d, m, lead=(2,), fmap="elu+1"):
    q, k, v = random_qkv(seed, n, d, m, lead)
    phi = get_feature_map(fmap)
    return phi.forward(q), phi.forward(k), v


# shapes across the 64-wide tiles: one chunk, a ragged second chunk, F and M past one tile
SHAPES = [(1, 1, 1), (5, 3, 2), (64, 2, 3), (70, 3, 5), (129, 66, 65)]


@pytest.mark.parametrize("form", [cumulative, chunked])
@pytest.mark.parametrize("n, d, m", SHAPES)
def test_causal_forms_match_numpy(emulated, form, n, d, m):
    phi_q, phi_k, v = features(n, n, d, m)
    dout = np.random.default_rng(1).standard_normal(v.shape)
    kw = dict(causal=True, eps=1e-6)
    want = numpy_chunked.attend(phi_q, phi_k, v, chunk_size=7, **kw)
    assert_close(form.attend(phi_q, phi_k, v, **kw), want)
    got = form.attend_backward(dout, phi_q, phi_k, v, **kw)
    for g, w in zip(got, numpy_chunked.attend_backward(dout, phi_q, phi_k, v, chunk_size=7, **kw)):
        assert_close(g, w)


@pytest.mark.parametrize("n, d, m", [(1, 2, 3), (70, 3, 5), (130, 66, 65)])
def test_padding_and_states_match_numpy(emulated, n, d, m):
    """Key padding (NaN in the padded rows) and a state handed in and out, forward and
    backward, against NumPy's chunked form: the state is added to every chunk's state."""
    rng = np.random.default_rng(n)
    phi_q, phi_k, v = features(n + 1, n, d, m)
    mask = rng.random((2, n)) < 0.7
    mask[:, 0] = True
    phi_k, v = np.where(mask[..., None], phi_k, np.nan), np.where(mask[..., None], v, np.nan)
    f = phi_k.shape[-1]
    state = State(rng.standard_normal((2, f, m)), rng.random((2, f)) + 0.5)
    dstate = State(rng.standard_normal((2, f, m)), rng.standard_normal((2, f)))
    dout = rng.standard_normal(v.shape)
    kw = dict(causal=True, eps=1e-6, key_mask=mask, initial_state=state)
    out, final = chunked.attend(phi_q, phi_k, v, return_state=True, **kw)
    want, want_final = numpy_chunked.attend(phi_q, phi_k, v, chunk_size=7, return_state=True,
                                            **kw)
    assert np.isfinite(out).all()
    for g, w in zip((out, *final), (want, *want_final)):
        assert_close(g, w)
    got = chunked.attend_backward(dout, phi_q, phi_k, v, dstate=dstate, **kw)
    wants = numpy_chunked.attend_backward(dout, phi_q, phi_k, v, chunk_size=7, dstate=dstate,
                                          **kw)
    assert np.all(got[1][~mask] == 0) and np.all(got[2][~mask] == 0)   # exactly
    for g, w in zip((*got[:3], *got[3]), (*wants[:3], *wants[3])):
        assert_close(g, w)


def test_float32_kernels_return_float32(emulated):
    phi_q, phi_k, v = (x.astype(np.float32) for x in features(3, 70, 3, 4))
    out = chunked.attend(phi_q, phi_k, v, causal=True, eps=1e-6)
    assert out.dtype == np.float32
    want = numpy_chunked.attend(phi_q, phi_k, v, causal=True, eps=1e-6)
    assert_close(out, want)                     # float32 against NumPy in float32


def test_nan_query_row_poisons_only_its_row(emulated):
    phi_q, phi_k, v = features(4, 70, 3, 2, lead=())
    phi_q[66, 1] = np.nan
    out = chunked.attend(phi_q, phi_k, v, causal=True, eps=1e-6)
    assert np.all(np.isnan(out[66])) and np.all(np.isfinite(np.delete(out, 66, axis=0)))


@pytest.mark.parametrize("f, m", [(3, 2), (70, 130)])
def test_step_matches_numpy(emulated, f, m):
    rng = np.random.default_rng(f)
    q, k = np.abs(rng.standard_normal((2, 3, f))) + 0.1, np.abs(rng.standard_normal((2, 3, f)))
    v = rng.standard_normal((2, 3, m))
    state = recurrent.State(rng.standard_normal((2, 3, f, m)),
                            np.abs(rng.standard_normal((2, 3, f))))
    got_out, got_state = step.step(q, k, v, state, 1e-6)
    want_out, want_state = recurrent.step(q, k, v, state, 1e-6)
    assert_close(got_out, want_out)
    for g, w in zip(got_state, want_state):     # S = S + k v^T: entries that cancel
        assert_close(g, w)


def random_state(rng, lead, f, m, dtype, compensated):
    """A state of positive-ish sums (and small compensation terms) to step from."""
    s, z = rng.standard_normal((*lead, f, m)), np.abs(rng.standard_normal((*lead, f)))
    arrays = [s, z] + ([1e-9 * rng.standard_normal(s.shape),
                        1e-9 * rng.standard_normal(z.shape)] if compensated else [])
    kind = recurrent.CompensatedState if compensated else recurrent.State
    return kind(*(a.astype(dtype) for a in arrays))


@pytest.mark.parametrize("compensated", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("f, m", [(3, 2), (70, 130)])
def test_step_into_matches_numpy(emulated, f, m, dtype, compensated):
    # in place, over several steps: the state as NumPy's reference computes it (bit for bit
    # when compensated: every rounding is spelled out), the outputs to the dtype's rounding
    rng = np.random.default_rng(f + m)
    got, want = (random_state(np.random.default_rng(0), (2, 3), f, m, dtype, compensated)
                 for _ in range(2))
    for _ in range(3):
        q, k = (np.abs(rng.standard_normal((2, 3, f))).astype(dtype) for _ in range(2))
        v = rng.standard_normal((2, 3, m)).astype(dtype)
        got_out, want_out = np.empty(v.shape, dtype), np.empty(v.shape, dtype)
        kernel, oracle = ((step.step_into_compensated, recurrent.step_into_compensated)
                          if compensated else (step.step_into, recurrent.step_into))
        kernel(q, k, v, *got, got_out, dtype(1e-6))
        oracle(q, k, v, *want, want_out, dtype(1e-6))
        assert_close(got_out, want_out)
        for g, w in zip(got, want):
            if compensated:
                np.testing.assert_array_equal(g, w)
            else:
                assert_close(g, w)


def test_compensated_float32_step_flushes_as_the_device_does(emulated):
    # products near float32's smallest normal: the exact build keeps subnormals as NumPy's
    # kahan_add_ does, the device build flushes them as the GPU (-ftz=true) does
    q, k, v = subnormal_steps(30)
    got, want = ([np.zeros(shape, np.float32) for shape in ((2, 70, 130), (2, 70)) * 2]
                 for _ in range(2))
    add = recurrent.kahan_add_ if emulated == "exact" else kahan_add_flushed_
    out = np.empty((2, 130), np.float32)
    for i in range(len(k)):
        step.step_into_compensated(q, k[i], v[i], got[0], got[1], got[2], got[3], out,
                                   np.float32(1e-6))
        add(want[0], want[2], k[i][..., :, None] * v[i][..., None, :])
        add(want[1], want[3], k[i])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 7, 40])
def test_softmax_matches_numpy(emulated, causal, n):
    q, k, v = random_qkv(n, n, 3, 2, (2,))
    dout = np.random.default_rng(2).standard_normal(v.shape)
    scale = 3 ** -0.5
    want = softmax_attention(q, k, v, causal=causal, backend="numpy")
    got = softmax.attend(q, k, v, causal=causal, scale=scale)
    assert_close(got, want)
    want = softmax_attention_backward(dout, q, k, v, causal=causal, backend="numpy")
    got = softmax.attend_backward(dout, q, k, v, causal=causal, scale=scale)
    for g, w in zip(got, want):
        assert_close(g, w)


def test_softmax_rows_longer_than_a_block(emulated):
    # 300 columns: each of the 256 threads visits one or two
    logits = np.random.default_rng(5).standard_normal((3, 300))
    p = logits.copy()
    launch.launch("softmax.cu", "softmax_rows", (3,), (p, 300, 0, 0.5))
    want = np.exp(0.5 * logits - (0.5 * logits).max(axis=1, keepdims=True))
    assert_close(p, want / want.sum(axis=1, keepdims=True))
    dp = logits[::-1].copy()
    launch.launch("softmax.cu", "softmax_rows_backward", (3,), (p, dp, 300, 0.5))
    want = p * (logits[::-1] - (logits[::-1] * p).sum(axis=1, keepdims=True)) * 0.5
    assert_close(dp, want)                      # dp - sum(dp p): entries that cancel


@pytest.mark.parametrize("n_q, n_k", [(1, 9), (7, 3), (300, 2)])
def test_softmax_cross_attention_matches_numpy(emulated, n_q, n_k):
    """Rows of Nk logits, Nq rows a head: the kernels' row length is the number of keys."""
    rng = np.random.default_rng(n_q + n_k)
    q, k, v = (rng.standard_normal((2, n, w)) for n, w in ((n_q, 3), (n_k, 3), (n_k, 4)))
    dout = rng.standard_normal((2, n_q, 4))
    want = softmax_attention(q, k, v, backend="numpy")
    assert_close(softmax.attend(q, k, v, causal=False, scale=3 ** -0.5), want)
    wants = softmax_attention_backward(dout, q, k, v, backend="numpy")
    gots = softmax.attend_backward(dout, q, k, v, causal=False, scale=3 ** -0.5)
    for g, w in zip(gots, wants):
        assert_close(g, w)


# A probe of the builds and of the barrier checks: threads that skip a barrier, a thread that
# leaves before a warp shuffle.
PROBE = r"""
typedef LINATTN_REAL real;
extern "C" __global__ void arithmetic(const real* x, real* out)
{
    if (threadIdx.x != 0) return;
    out[0] = x[0] * x[1] + x[2];                     // one fma when contracted
    out[1] = __fadd_rn(__fmul_rn(x[0], x[1]), x[2]); // never contracted
    out[2] = x[3] * x[4];                            // subnormal in float32, or flushed
}
extern "C" __global__ void early_exit(real* out)
{
    if (threadIdx.x == 5) return;                    // skips the barrier below
    __syncthreads();
    out[threadIdx.x] = 1;
}
extern "C" __global__ void barrier_in_a_branch(real* out)
{
    if (threadIdx.x < 32) __syncthreads();           // pairs with the others' one barrier
    __syncthreads();
    out[threadIdx.x] = 1;
}
extern "C" __global__ void shuffle_after_exit(real* out)
{
    if (threadIdx.x == 3) return;                    // its warp waits for it at the shuffle
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, real(threadIdx.x), 1);
}
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """probe(variant): the float32 build of PROBE."""
    tmp, built = tmp_path_factory.mktemp("probe"), {}
    source = tmp / "probe.cu"
    source.write_text(PROBE)

    def get(variant):
        if variant not in built:
            built[variant] = build(source, np.float32, variant, tmp / f"probe.{variant}.so")
        return built[variant]
    return get


def test_device_build_contracts_and_flushes(probe, variant):
    # a = b = 1 + 2^-12: a b = 1 + 2^-11 + 2^-24 rounds to 1 + 2^-11 (a tie, to even), so
    # a b - (1 + 2^-11) is 0 rounded twice and 2^-24 in one fma; 2^-70 squared is 2^-140,
    # below float32's smallest normal 2^-126
    x = np.array([1 + 2**-12, 1 + 2**-12, -(1 + 2**-11), 2**-70, 2**-70], np.float32)
    out = np.full(3, np.nan, np.float32)
    run_kernel(probe(variant), "arithmetic", np.float32, (1,), (32,), (x, out))
    exact = variant == "exact"
    assert out[0] == (0 if exact else np.float32(2**-24))
    assert out[1] == 0                           # the explicitly rounded form, in both builds
    assert out[2] == (np.float32(2**-140) if exact else 0)


@pytest.mark.parametrize("function, message", [
    ("early_exit", "skipped a barrier"),
    ("barrier_in_a_branch", "skipped a barrier"),
    ("shuffle_after_exit", "deadlock"),
])
def test_a_broken_barrier_fails_the_launch(probe, function, message):
    lib = probe("exact")
    lib.emulate_set_timeout(ctypes.c_double(2.0))
    try:
        out = np.zeros(64, np.float32)
        with pytest.raises(AssertionError, match=message):
            run_kernel(lib, function, np.float32, (2,), (64,), (out,))
    finally:
        lib.emulate_set_timeout(ctypes.c_double(60.0))
