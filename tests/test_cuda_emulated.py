"""The CUDA kernels, run on the CPU: every linattn/cuda/*.cu file compiled by g++ with
tests/cuda_emulator.h (one thread per CUDA thread, barriers for __syncthreads), launched by the
package's own Python code on NumPy arrays, and held to the NumPy oracle in float64.

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
from linattn.forms import chunked as numpy_chunked, recurrent
from linattn.softmax import softmax_attention, softmax_attention_backward

from helpers import random_qkv

GXX = shutil.which("g++")
pytestmark = [
    pytest.mark.slow,                       # g++ builds the emulated kernels
    pytest.mark.skipif(GXX is None, reason="g++ is not on the PATH"),
    pytest.mark.skipif(platform.system() != "Linux"
                       or platform.machine() not in ("x86_64", "aarch64"),
                       reason="the emulator's launch relies on the Linux x86-64/AArch64 ABI"),
]
SLOTS = 16                  # integer-class argument slots of emulate_launch


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    """{(source, dtype): ctypes library}: each source compiled for the CPU, once per dtype."""
    tmp = tmp_path_factory.mktemp("emulated")
    header = Path(__file__).with_name("cuda_emulator.h")
    libs = {}
    for source in launch.SOURCES:
        for dtype in (np.float32, np.float64):
            real = launch.options(dtype)[-1]                    # -DLINATTN_REAL=...
            path = tmp / f"{source}.{np.dtype(dtype).name}.so"
            done = subprocess.run([GXX, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread",
                                   "-ffp-contract=off", "-Wno-unknown-pragmas", real, "-include", str(header),
                                   "-x", "c++", str(launch.source_path(source)), "-o", str(path)],
                                  capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
            libs[source, np.dtype(dtype)] = ctypes.CDLL(str(path))
    return libs


@pytest.fixture
def emulated(monkeypatch, libraries):
    """Route the package's kernel launches to the CPU builds."""
    def kernel(source, function, dtype):
        lib = libraries[source, np.dtype(dtype)]

        def run(grid, block, args):
            ints = [0 if a is None else a.ctypes.data if isinstance(a, np.ndarray) else int(a)
                    for a in args if not isinstance(a, (np.float32, np.float64))]
            reals = [float(a) for a in args if isinstance(a, (np.float32, np.float64))]
            assert len(ints) <= SLOTS and len(reals) <= 1
            entry = ctypes.cast(getattr(lib, function), ctypes.c_void_p)
            lib.emulate_launch(*(ctypes.c_uint(g) for g in (*grid, 1, 1)[:3]),
                               ctypes.c_uint(block[0]), entry,
                               (ctypes.c_longlong * SLOTS)(*ints),
                               ctypes.c_double(reals[0] if reals else 0.0),
                               ctypes.c_int(dtype == np.float32))
        return run

    monkeypatch.setattr(launch, "kernel", kernel)


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
    np.testing.assert_allclose(form.attend(phi_q, phi_k, v, **kw), want, rtol=1e-10)
    got = form.attend_backward(dout, phi_q, phi_k, v, **kw)
    for g, w in zip(got, numpy_chunked.attend_backward(dout, phi_q, phi_k, v, chunk_size=7, **kw)):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def test_float32_kernels_return_float32(emulated):
    phi_q, phi_k, v = (x.astype(np.float32) for x in features(3, 70, 3, 4))
    out = chunked.attend(phi_q, phi_k, v, causal=True, eps=1e-6)
    assert out.dtype == np.float32
    want = numpy_chunked.attend(phi_q, phi_k, v, causal=True, eps=1e-6)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


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
    np.testing.assert_allclose(got_out, want_out, rtol=1e-10)
    for g, w in zip(got_state, want_state):
        np.testing.assert_allclose(g, w, rtol=1e-12)


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
        rtol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(got_out, want_out, rtol=rtol,
                                   atol=rtol * np.abs(want_out).max())
        for g, w in zip(got, want):
            if compensated:
                np.testing.assert_array_equal(g, w)
            else:
                np.testing.assert_allclose(g, w, rtol=rtol)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 7, 40])
def test_softmax_matches_numpy(emulated, causal, n):
    q, k, v = random_qkv(n, n, 3, 2, (2,))
    dout = np.random.default_rng(2).standard_normal(v.shape)
    scale = 3 ** -0.5
    want = softmax_attention(q, k, v, causal=causal, backend="numpy")
    got = softmax.attend(q, k, v, causal=causal, scale=scale)
    np.testing.assert_allclose(got, want, rtol=1e-10)
    want = softmax_attention_backward(dout, q, k, v, causal=causal, backend="numpy")
    got = softmax.attend_backward(dout, q, k, v, causal=causal, scale=scale)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def test_softmax_rows_longer_than_a_block(emulated):
    # 300 columns: each of the 256 threads visits one or two
    logits = np.random.default_rng(5).standard_normal((3, 300))
    p = logits.copy()
    launch.launch("softmax.cu", "softmax_rows", (3,), (p, 300, 0, 0.5))
    want = np.exp(0.5 * logits - (0.5 * logits).max(axis=1, keepdims=True))
    np.testing.assert_allclose(p, want / want.sum(axis=1, keepdims=True), rtol=1e-12)
    dp = logits[::-1].copy()
    launch.launch("softmax.cu", "softmax_rows_backward", (3,), (p, dp, 300, 0.5))
    want = p * (logits[::-1] - (logits[::-1] * p).sum(axis=1, keepdims=True)) * 0.5
    np.testing.assert_allclose(dp, want, rtol=1e-12)


@pytest.mark.parametrize("n_q, n_k", [(1, 9), (7, 3), (300, 2)])
def test_softmax_cross_attention_matches_numpy(emulated, n_q, n_k):
    """Rows of Nk logits, Nq rows a head: the kernels' row length is the number of keys."""
    rng = np.random.default_rng(n_q + n_k)
    q, k, v = (rng.standard_normal((2, n, w)) for n, w in ((n_q, 3), (n_k, 3), (n_k, 4)))
    dout = rng.standard_normal((2, n_q, 4))
    want = softmax_attention(q, k, v, backend="numpy")
    np.testing.assert_allclose(softmax.attend(q, k, v, causal=False, scale=3 ** -0.5), want,
                               rtol=1e-10)
    wants = softmax_attention_backward(dout, q, k, v, backend="numpy")
    gots = softmax.attend_backward(dout, q, k, v, causal=False, scale=3 ** -0.5)
    for g, w in zip(gots, wants):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("form", [cumulative, chunked])
def test_linear_cross_attention_matches_numpy(emulated, form):
    rng = np.random.default_rng(4)
    phi_q, phi_k = np.exp(rng.standard_normal((2, 5, 3))), np.exp(rng.standard_normal((2, 9, 3)))
    v, dout = rng.standard_normal((2, 9, 4)), rng.standard_normal((2, 5, 4))
    kw = dict(causal=False, eps=1e-6)
    np.testing.assert_allclose(form.attend(phi_q, phi_k, v, **kw),
                               numpy_chunked.attend(phi_q, phi_k, v, chunk_size=4, **kw),
                               rtol=1e-10)
    for g, w in zip(form.attend_backward(dout, phi_q, phi_k, v, **kw),
                    numpy_chunked.attend_backward(dout, phi_q, phi_k, v, chunk_size=4, **kw)):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
