"""The tiled (online-softmax) Numba kernels of softmax attention, ``numba_cpu.softmax``, and
their tile loops, ``numba_cpu.flash_tiles``: agreement with a NumPy oracle for self- and
cross-attention (Nq != Nk), gradients against central differences, tiles of every shape,
NaN and large logits, empty sizes, the float32 exp, and memory."""
import contextlib
from unittest import mock

import numba
import numpy as np
import pytest
from hypothesis import given, strategies as st
from numba import njit

from linattn.forms import softmax as numpy_softmax
from linattn.numba_cpu import flash_tiles, softmax

from helpers import assert_gradients_match, peak_traced_bytes, relative_error

LEADS = [(), (1,), (2,), (2, 3)]


def reference(q, k, v, causal, scale):
    """softmax(scale q k^T) v over (..., Nq, Nk) logits, row maxima subtracted: the oracle
    for any Nq, Nk (causal: the j <= i mask of Eq. 8, Nq == Nk)."""
    logits = scale * (q @ k.swapaxes(-1, -2))                     # (..., Nq, Nk)
    if q.shape[-2] == 0:
        return logits, logits @ v                                 # no rows to normalise
    if causal:
        n = q.shape[-2]
        logits = np.where(np.tril(np.ones((n, n), dtype=bool)), logits, -np.inf)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return p, p @ v


def reference_backward(dout, q, k, v, causal, scale):
    """(dq, dk, dv): dv = P^T dout, dL = P * (dP - rowsum(dP * P)), dP = dout v^T,
    dq = scale dL k, dk = scale dL^T q."""
    p, _ = reference(q, k, v, causal, scale)
    dp = dout @ v.swapaxes(-1, -2)                                # (..., Nq, Nk)
    dlogits = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    return (scale * dlogits @ k, scale * dlogits.swapaxes(-1, -2) @ q,
            p.swapaxes(-1, -2) @ dout)


def draw(seed, lead, nq, nk, d, m, dtype=np.float64):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((*lead, nq, d)), rng.standard_normal((*lead, nk, d))
    v, dout = rng.standard_normal((*lead, nk, m)), rng.standard_normal((*lead, nq, m))
    return tuple(x.astype(dtype) for x in (q, k, v, dout))


def run(q, k, v, dout, causal, scale, tiles=None):
    """(out, (dq, dk, dv)) from the kernels, with ``tiles`` (B, C) forced if given."""
    with mock.patch.object(softmax, "tiles", lambda *shape: tiles or _default_tiles(*shape)):
        return (softmax.attend(q, k, v, causal=causal, scale=scale),
                softmax.attend_backward(dout, q, k, v, causal=causal, scale=scale))


_default_tiles = softmax.tiles


def assert_matches(got, want, rtol=1e-10, atol=1e-12):
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def test_the_oracle_is_linattns_numpy_softmax():
    q, k, v, dout = draw(0, (2,), 9, 9, 3, 4)
    for causal in (False, True):
        want = numpy_softmax.attend(q, k, v, causal=causal, scale=0.4)
        np.testing.assert_allclose(reference(q, k, v, causal, 0.4)[1], want, rtol=1e-13)
        assert_matches(reference_backward(dout, q, k, v, causal, 0.4),
                       numpy_softmax.attend_backward(dout, q, k, v, causal=causal, scale=0.4),
                       rtol=1e-12, atol=1e-14)


@given(nq=st.integers(1, 300), nk=st.integers(1, 300), d=st.integers(1, 70),
       m=st.integers(1, 70), lead=st.sampled_from(LEADS), causal=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_matches_the_oracle(nq, nk, d, m, lead, causal, seed):
    nk = nq if causal else nk
    q, k, v, dout = draw(seed, lead, nq, nk, d, m)
    scale = d ** -0.5
    out, grads = run(q, k, v, dout, causal, scale)
    np.testing.assert_allclose(out, reference(q, k, v, causal, scale)[1], rtol=1e-10,
                               atol=1e-12)
    assert_matches(grads, reference_backward(dout, q, k, v, causal, scale))


@given(nq=st.integers(1, 40), nk=st.integers(1, 40), block_q=st.integers(1, 9),
       block_k=st.integers(1, 9), causal=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_any_tile_shape_gives_the_same_answer(nq, nk, block_q, block_k, causal, seed):
    # tiles smaller than the sizes, B != C: the causal mask cuts tiles off the diagonal
    nk = nq if causal else nk
    q, k, v, dout = draw(seed, (2,), nq, nk, 3, 4)
    out, grads = run(q, k, v, dout, causal, 0.6, tiles=(block_q, block_k))
    np.testing.assert_allclose(out, reference(q, k, v, causal, 0.6)[1], rtol=1e-10,
                               atol=1e-12)
    assert_matches(grads, reference_backward(dout, q, k, v, causal, 0.6))


@given(nq=st.integers(1, 200), nk=st.integers(1, 200), d=st.integers(1, 70),
       lead=st.sampled_from(LEADS), causal=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_float32_stays_float32_and_close(nq, nk, d, lead, causal, seed):
    nk = nq if causal else nk
    q, k, v, dout = draw(seed, lead, nq, nk, d, 5)
    out, grads = run(*(x.astype(np.float32) for x in (q, k, v, dout)), causal, d ** -0.5)
    assert out.dtype == np.float32 and all(g.dtype == np.float32 for g in grads)
    # errors against the largest entry, or 1 (a gradient may be 0: one key, say)
    assert np.max(np.abs(out - reference(q, k, v, causal, d ** -0.5)[1])) < 1e-5
    for g, w in zip(grads, reference_backward(dout, q, k, v, causal, d ** -0.5)):
        assert np.max(np.abs(g - w)) < 1e-5 * max(1, np.max(np.abs(w)))


@pytest.mark.parametrize("nk", [1, 63, 64, 65, 1000, 4097])
@pytest.mark.parametrize("lead", [(), (3,)])
def test_one_query_against_a_long_cache(nk, lead):
    # the generation step: Nq = 1 runs its tile along keys (``_scale_and_max_column``)
    for dtype, rtol, atol in ((np.float64, 1e-10, 1e-12), (np.float32, 1e-5, 1e-6)):
        q, k, v, dout = draw(nk, lead, 1, nk, 64, 64, dtype)
        out, grads = run(q, k, v, dout, False, 0.125)
        _, want = reference(*(x.astype(np.float64) for x in (q, k, v)), False, 0.125)
        np.testing.assert_allclose(out, want, rtol=rtol, atol=atol)
        assert_matches(grads, reference_backward(dout, q, k, v, False, 0.125), rtol=rtol,
                       atol=atol)


@pytest.mark.parametrize("causal, nq, nk", [(False, 3, 5), (False, 4, 1), (False, 1, 6),
                                            (True, 5, 5)])
@pytest.mark.parametrize("tiles", [None, (2, 3)])
def test_backward_matches_finite_differences(causal, nq, nk, tiles):
    q, k, v, _ = draw(3, (2,), nq, nk, 3, 2)
    with mock.patch.object(softmax, "tiles", lambda *shape: tiles or _default_tiles(*shape)):
        assert_gradients_match(
            lambda q, k, v: softmax.attend(q, k, v, causal=causal, scale=0.7),
            lambda dout, q, k, v: softmax.attend_backward(dout, q, k, v, causal=causal,
                                                          scale=0.7),
            (q, k, v))


@pytest.mark.parametrize("causal", [False, True])
def test_one_thread_and_many_agree(causal, monkeypatch):
    # small work runs ``_forward_serial``; PARALLEL_WORK = 0 sends it to the threads, and a
    # row's key blocks to 1, 2 or 3 segments, each with its own copy of dq
    q, k, v, dout = draw(4, (), 150, 150, 6, 7)
    out, grads = run(q, k, v, dout, causal, 0.5, tiles=(16, 16))
    monkeypatch.setattr(softmax, "PARALLEL_WORK", 0)
    for threads in (1, 2, 3):
        monkeypatch.setattr(numba, "get_num_threads", lambda: threads)
        got_out, got_grads = run(q, k, v, dout, causal, 0.5, tiles=(16, 16))
        np.testing.assert_allclose(got_out, out, rtol=1e-13, atol=1e-15)
        assert_matches(got_grads, grads, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_nan_query_row_poisons_only_its_row(causal, dtype):
    q, k, v, dout = draw(5, (), 200, 200, 8, 3, dtype)
    q[130, 2] = np.nan                         # in the third block of 64 queries
    out = softmax.attend(q, k, v, causal=causal, scale=0.3)
    assert np.all(np.isnan(out[130]))
    assert np.all(np.isfinite(np.delete(out, 130, axis=0)))
    dq, dk, dv = softmax.attend_backward(dout, q, k, v, causal=causal, scale=0.3)
    assert np.all(np.isnan(dq[130])) and np.all(np.isfinite(np.delete(dq, 130, axis=0)))
    # dk, dv: NaN for the keys query 130 sees; causal, the keys after it keep dv (NumPy's
    # reference makes it NaN, through 0 * NaN in the masked pairs); their dk may take NaN
    # from 0 * q[130] in a product, as NumPy's does
    seen = slice(0, 131) if causal else slice(None)
    assert np.all(np.isnan(dk[seen])) and np.all(np.isnan(dv[seen]))
    if causal:
        assert np.all(np.isfinite(dv[131:]))


@pytest.mark.parametrize("causal", [False, True])
def test_nan_key_row_as_in_numpy(causal):
    # a NaN key poisons every query that sees it: all of them, or causal those after it
    q, k, v, dout = draw(6, (), 150, 150, 4, 3)
    k[70, 0] = np.nan
    out = softmax.attend(q, k, v, causal=causal, scale=0.5)
    np.testing.assert_allclose(out, numpy_softmax.attend(q, k, v, causal=causal, scale=0.5),
                               rtol=1e-10, atol=1e-12)         # NaN where NumPy has NaN
    assert np.all(np.isfinite(out[:70])) == causal


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_large_logits_do_not_overflow(causal, dtype):
    q, k, v, dout = draw(7, (2,), 130, 130, 4, 3, dtype)
    q *= 1e4 if dtype == np.float64 else 1e3
    out = softmax.attend(q, k, v, causal=causal, scale=1.0)        # logits up to ~1e5
    _, want = reference(*(x.astype(np.float64) for x in (q, k, v)), causal, 1.0)
    assert np.all(np.isfinite(out))
    assert relative_error(out, want) < (1e-3 if dtype == np.float32 else 1e-10)
    grads = softmax.attend_backward(dout, q, k, v, causal=causal, scale=1.0)
    assert all(np.all(np.isfinite(g)) for g in grads)


@pytest.mark.parametrize("nq, nk, m, lead, causal", [
    (0, 0, 3, (2,), True), (0, 0, 3, (), False), (0, 5, 3, (2,), False),
    (4, 6, 0, (2,), False), (5, 5, 0, (), True), (3, 4, 2, (0,), False), (3, 3, 2, (2, 0), True)])
def test_empty_sizes_as_numpy_gives(nq, nk, m, lead, causal):
    q, k, v, dout = draw(8, lead, nq, nk, 3, m)
    out, grads = run(q, k, v, dout, causal, 0.5)
    np.testing.assert_array_equal(out, reference(q, k, v, causal, 0.5)[1])
    for g, w in zip(grads, reference_backward(dout, q, k, v, causal, 0.5)):
        np.testing.assert_array_equal(g, w)          # zeros or empty, same shapes


def test_no_keys_for_some_queries_is_an_error_as_in_numpy():
    q, k, v, dout = draw(9, (2,), 3, 0, 4, 2)
    with pytest.raises(ValueError):
        reference(q, k, v, False, 0.5)
    with pytest.raises(ValueError, match="zero keys"):
        softmax.attend(q, k, v, causal=False, scale=0.5)
    with pytest.raises(ValueError, match="zero keys"):
        softmax.attend_backward(dout, q, k, v, causal=False, scale=0.5)


def test_causal_needs_as_many_keys_as_queries():
    q, k, v, _ = draw(10, (), 3, 4, 2, 2)
    with pytest.raises(ValueError, match="Nq == Nk"):
        softmax.attend(q, k, v, causal=True, scale=1.0)


@njit
def _exp32_all(x, out):
    for i in range(x.size):
        out[i] = flash_tiles.exp_nonpositive(x[i])


def test_float32_exp_within_one_ulp():
    x = np.concatenate([np.linspace(-87.33, 0, 1_000_001, dtype=np.float32),
                        -np.logspace(-8, 0, 10_001).astype(np.float32)])
    got = np.empty_like(x)
    _exp32_all(x, got)
    want = np.exp(x.astype(np.float64))
    ulps = np.abs(got - want) / np.spacing(want.astype(np.float32))
    assert ulps.max() < 1.0
    special = np.array([0.0, -0.0, -87.4, -200.0, -np.inf, np.nan], np.float32)
    _exp32_all(special, got[:6])
    np.testing.assert_array_equal(got[:6], [1, 1, 0, 0, 0, np.nan])   # no subnormals


def test_float32_tile_loops_do_no_double_arithmetic():
    from test_numba_cpu import float64_in_ir
    St, row = np.ones((4, 3), np.float32), np.ones(3, np.float32)
    one = np.float32(1)
    assert not float64_in_ir(flash_tiles.scale_and_max, St, one, True, 0, 1, row)
    assert not float64_in_ir(flash_tiles.scale_and_max, St[:, :1].copy(), one, False, 0, 1,
                             row)
    assert not float64_in_ir(flash_tiles.exp_and_sum, St, row, row.copy(), row.copy(),
                             row.copy())
    assert not float64_in_ir(flash_tiles.exp_and_sum, St[:, :1].copy(), row, row.copy(),
                             row.copy(), row.copy())
    assert not float64_in_ir(flash_tiles.finish_rows, St[:3], row, row.copy(), row.copy())
    assert not float64_in_ir(flash_tiles.probabilities_t, St, one, True, 0, 1, row)
    assert not float64_in_ir(flash_tiles.dlogits_t, St, St.copy(), row, one, True, 0, 1)
    # the check can fail: the same loop given a float64 scale computes in double
    assert float64_in_ir(flash_tiles.dlogits_t, St, St.copy(), row, 1.0, True, 0, 1)


@pytest.mark.parametrize("sizing", ["SMALL", "LARGE"])
def test_tiles_stay_within_their_budgets(sizing):
    budget = getattr(softmax, sizing)
    for nq, nk, d, m in [(4096, 4096, 64, 64), (1, 10**6, 64, 64), (10**5, 10**5, 1, 1),
                         (4096, 4096, 256, 256), (300, 300, 70, 3)]:
        block_q, block_k = softmax.tiles(nq, nk, d, m, budget)
        assert block_q * block_k <= budget["tile"]
        assert block_q * block_k * max(d, m) <= budget["product"]
        for block, n in ((block_q, nq), (block_k, nk)):    # whole vectors where it can
            assert block % softmax.ALIGN == 0 or block < softmax.ALIGN or block == n
    # SMALL keeps every product on the calling thread without holding the BLAS; LARGE's
    # exceed the threshold at the benchmark's shape, so that they must be held
    assert max(d, m) * np.prod(softmax.tiles(nq, nk, d, m, softmax.SMALL)) < (
        softmax.SINGLE_THREAD_PRODUCT)
    assert softmax.tiles(4096, 4096, 64, 64, softmax.SMALL) == (80, 96)
    assert softmax.tiles(4096, 4096, 64, 64, softmax.LARGE) == (256, 256)


@pytest.mark.parametrize("large, held, want", [(False, True, "SMALL"), (True, True, "LARGE"),
                                              (True, False, "SMALL")])
def test_the_plan_follows_the_blas_kernel_and_the_hold(large, held, want, monkeypatch):
    holds = []

    @contextlib.contextmanager
    def hold():
        holds.append(1)
        yield held

    monkeypatch.setattr(softmax.blas_threads, "large_products", lambda: large)
    monkeypatch.setattr(softmax.blas_threads, "hold", hold)
    with softmax.planned_tiles(4096, 4096, 64, 64) as blocks:
        assert blocks == softmax.tiles(4096, 4096, 64, 64, getattr(softmax, want))
    assert len(holds) == int(large)
    # LARGE tiles a short sequence clips under the threshold need no hold
    with softmax.planned_tiles(40, 40, 64, 64) as blocks:
        assert blocks == (40, 40)
    assert len(holds) == int(large)


@pytest.mark.parametrize("causal", [False, True])
def test_large_tiles_hold_the_blas_and_agree(causal, monkeypatch):
    # LARGE tiles on a shape that runs in parallel: the products go above OpenBLAS's
    # threshold, so both kernels run inside a hold of the BLAS (one that takes wherever a
    # hold takes here), and agree with the oracle
    holds = []
    hold = softmax.blas_threads.hold
    with hold() as takes:
        pass

    @contextlib.contextmanager
    def counted():
        with hold() as took:
            holds.append(softmax.blas_threads.holding())
            yield took

    monkeypatch.setattr(softmax.blas_threads, "large_products", lambda: True)
    monkeypatch.setattr(softmax.blas_threads, "hold", counted)
    q, k, v, dout = draw(5, (2, 2), 700, 700, 64, 40)
    assert softmax._parallel(q, k, v, causal)
    out = softmax.attend(q, k, v, causal=causal, scale=0.3)
    grads = softmax.attend_backward(dout, q, k, v, causal=causal, scale=0.3)
    assert holds == [takes] * 2
    np.testing.assert_allclose(out, reference(q, k, v, causal, 0.3)[1], rtol=1e-10,
                               atol=1e-12)
    assert_matches(grads, reference_backward(dout, q, k, v, causal, 0.3))
    # the check can fail: where the kernel does not favour them, no tile is held
    monkeypatch.setattr(softmax.blas_threads, "large_products", lambda: False)
    softmax.attend(q, k, v, causal=causal, scale=0.3)
    assert len(holds) == 2


def _forward_and_backward(attend, attend_backward, q, k, v, dout, causal):
    attend(q, k, v, causal=causal, scale=0.125)
    attend_backward(dout, q, k, v, causal=causal, scale=0.125)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_memory_grows_with_n_not_n_squared(causal):
    # What this sees: every array NumPy allocates from Python (out, lse, D, the copies of dq,
    # the gradients) and the arrays the compiled kernels make with np.empty (Numba allocates
    # through Python's allocator, which tracemalloc traces): per-unit scratch whose size
    # ``tiles`` bounds (``test_tiles_stay_within_their_budgets``).
    q, k, v, dout = draw(11, (2,), 2048, 2048, 64, 64, np.float32)
    inputs = sum(x.nbytes for x in (q, k, v, dout))                     # 4 MiB
    _forward_and_backward(softmax.attend, softmax.attend_backward, q, k, v, dout, causal)
    peak = peak_traced_bytes(_forward_and_backward, softmax.attend, softmax.attend_backward,
                       q, k, v, dout, causal)
    assert peak < 2 * inputs
    # the check can fail: NumPy's reference holds (2, 2048, 2048) matrices, 8 x the inputs
    numpy_peak = peak_traced_bytes(_forward_and_backward, numpy_softmax.attend,
                             numpy_softmax.attend_backward, q, k, v, dout, causal)
    assert numpy_peak > 4 * inputs
