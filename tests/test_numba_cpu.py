"""The Numba backend's own machinery: state blocks, blocks of positions and segments, the fused
elu+1 and its exp, the dtype policy inside the loops, the compile cache, and how "auto" picks
a backend. Its agreement with the oracle is
tested with every other path, by the parametrised tests of test_linear, test_recurrent and
test_softmax."""
import subprocess
import sys

import numba
import numpy as np
import pytest
from numba import njit

from linattn import linear_attention, linear_attention_backward
from linattn.feature_maps import EluPlusOne
from linattn.numba_cpu import blas, chunked, elu, products, softmax, step

from helpers import random_qkv


def run_product(causal, n_blocks, reverse, eps, seed=0):
    a, c, b = random_qkv(seed, 23, 5, 37, (2,))          # a, c (2, 23, 5); b (2, 23, 37)
    a, c = np.exp(a), np.exp(c)
    out, den = np.empty((2, 23, 35)), np.empty((2, 23))  # out narrower than b, as for dv
    if causal:
        products.causal_product(a, b, c, reverse, eps, out, den, n_blocks, np.empty((0, 0, 0)))
    else:
        products.global_product(a, b, c, eps, out, den, n_blocks)
    return out, den


@pytest.mark.parametrize("causal, reverse", [(True, False), (True, True), (False, False)])
@pytest.mark.parametrize("eps", [-1.0, 1e-6])
@pytest.mark.parametrize("n_blocks", [2, 3])
def test_state_blocks_change_nothing(causal, reverse, eps, n_blocks):
    # the state in 2 or 3 unequal blocks: 5 rows (causal, partial readouts summed after)
    # or 35 columns (global, each unit recomputing the normaliser)
    want_out, want_den = run_product(causal, 1, reverse, eps)
    got_out, got_den = run_product(causal, n_blocks, reverse, eps)
    np.testing.assert_allclose(got_out, want_out, rtol=1e-12)
    if eps >= 0:
        np.testing.assert_allclose(got_den, want_den, rtol=1e-12)


@pytest.mark.parametrize("method", ["linear", "chunked"])
@pytest.mark.parametrize("causal", [False, True])
def test_one_wide_row_matches_the_oracle(method, causal):
    # one row and 48 columns: two threads split the state's columns between them
    q, k, v = random_qkv(1, 70, 40, 48)
    dout = np.random.default_rng(2).standard_normal(v.shape)
    kw = dict(causal=causal, chunk_size=16)
    want = linear_attention(q, k, v, method="quadratic", backend="numpy", **kw)
    got = linear_attention(q, k, v, method=method, backend="numba", **kw)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    grads = linear_attention_backward(dout, q, k, v, method=method, backend="numba", **kw)
    oracle = linear_attention_backward(dout, q, k, v, method="quadratic", backend="numpy", **kw)
    for g, w in zip(grads, oracle):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-11)


def ulps(got, x):
    """|got - exp(x)| in units of the last place of exp(x) rounded to got's dtype."""
    want = np.exp(x.astype(np.float64))
    return np.abs(got - want) / np.spacing(want.astype(got.dtype)).astype(np.float64)


@pytest.mark.parametrize("dtype, low, bound", [(np.float32, -104, 1.25), (np.float64, -745, 1)])
def test_exp_is_within_an_ulp_over_its_whole_range(dtype, low, bound):
    # x + 1 above 0, so -x hits the exp path: every x from the underflow to 0
    x = np.linspace(low, 0, 1_000_001).astype(dtype)
    phi = elu.features(x)
    tiny = np.finfo(dtype).tiny                          # subnormal results: absolute error
    normal = phi >= tiny
    assert ulps(phi[normal], x[normal]).max() <= bound
    assert np.abs(phi[~normal] - np.exp(x[~normal].astype(np.float64))).max() <= \
        np.spacing(dtype(0))
    # the check can fail: three ulps more are seen
    worse = (phi[normal] * (1 + 3 * np.finfo(dtype).eps)).astype(dtype)
    assert ulps(worse, x[normal]).max() > bound


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_elu_is_the_feature_map(dtype):
    # huge x: the vectorised select computes exp there too, and must not index out of range
    x = np.array([-np.inf, -800.0, -30.0, -1.5, -1e-30, -0.0, 0.0, 1e-30, 0.7, 3.0, 1e30,
                  np.finfo(dtype).max, np.inf, np.nan])
    x = np.concatenate([x, np.random.default_rng(3).standard_normal(50)]).astype(dtype)
    fmap = EluPlusOne()
    want = fmap.forward(x)
    got = elu.features(x)
    np.testing.assert_allclose(got, want, rtol=2 * np.finfo(dtype).eps, atol=0)
    assert got.dtype == dtype and got[0] == 0 and np.isnan(got[-51])
    dphi = np.linspace(-2, 2, x.size).astype(dtype)
    np.testing.assert_allclose(elu.vjp_(x, dphi.copy()), fmap.vjp(x, dphi),
                               rtol=2 * np.finfo(dtype).eps, atol=0)
    # strided views: read through, results in fresh arrays, not lost in a reshaped copy
    grid, dgrid = x[:60].reshape(6, 10).T, dphi[:60].reshape(6, 10).T
    np.testing.assert_allclose(elu.features(grid), fmap.forward(grid),
                               rtol=2 * np.finfo(dtype).eps, atol=0)
    np.testing.assert_allclose(elu.vjp_(grid, dgrid.copy()), fmap.vjp(grid, dgrid),
                               rtol=2 * np.finfo(dtype).eps, atol=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("a_order, b_order", [("C", "C"), ("F", "C"), ("C", "F"), ("F", "F")])
@pytest.mark.parametrize("beta", [0, 1, 0.5])
def test_gemm_adds_the_product_into_out(dtype, a_order, b_order, beta):
    rng = np.random.default_rng(3)
    a = np.asarray(rng.standard_normal((5, 7)), dtype, order=a_order)
    b = np.asarray(rng.standard_normal((7, 3)), dtype, order=b_order)
    whole = rng.standard_normal((4, 9, 3)).astype(dtype)
    out = whole[2, 3:8]                                   # a view: rows of a larger array
    want = a.astype(np.float64) @ b + beta * out
    bound = 8 * np.finfo(dtype).eps * (np.abs(a) @ np.abs(b) + np.abs(beta * out))
    blas.gemm(a, b, out, beta)
    assert np.all(np.abs(out - want) <= bound)            # rounding of a sum of 8 terms
    assert np.count_nonzero(whole[2, :3]) == 9 and np.count_nonzero(whole[2, 8:]) == 3


def test_gemm_edge_cases():
    a, b = np.ones((2, 3)), np.ones((3, 4))
    out = np.full((2, 4), np.nan)
    blas.gemm(a, b, out, 0)                               # beta = 0 ignores out, NaN too
    np.testing.assert_array_equal(out, 3.0)
    a[1, 2] = np.nan
    blas.gemm(a, b, out, 1)                               # NaN in a reaches its row only
    assert np.isnan(out[1]).all() and (out[0] == 6.0).all()
    out = np.full((2, 4), 2.0)
    blas.gemm(np.ones((2, 0)), np.ones((0, 4)), out, 0.5)  # k = 0: beta out
    np.testing.assert_array_equal(out, 1.0)
    blas.gemm(np.ones((2, 0)), np.ones((0, 4)), out, 0)
    np.testing.assert_array_equal(out, 0.0)
    blas.gemm(np.ones((0, 3)), np.ones((3, 4)), np.ones((0, 4)), 1)   # empty: nothing
    with pytest.raises(ValueError, match="shapes"):
        blas.gemm(np.ones((2, 3)), np.ones((4, 4)), np.ones((2, 4)), 0)


def run_sweeps(lead, n, width, chunk_size, fused, causal=True):
    """(out, dq, dk, dv) of chunked.attend(_backward) on elu+1 features, or fused."""
    q, k, v = random_qkv(11, n, width, width + 3, lead)
    dout = np.random.default_rng(12).standard_normal(v.shape)
    if not fused:
        q, k = EluPlusOne().forward(q), EluPlusOne().forward(k)
    kw = dict(causal=causal, eps=1e-6, chunk_size=chunk_size, elu=fused)
    return (chunked.attend(q, k, v, **kw), *chunked.attend_backward(dout, q, k, v, **kw))


@pytest.mark.parametrize("lead, n, width, chunk_size", [
    ((), 1, 64, 32), ((), 130, 64, 32), ((), 400, 64, 32), ((3,), 97, 64, 64),
    ((2, 4), 70, 40, 16)])
@pytest.mark.parametrize("causal", [True, False])
def test_blocks_at_real_widths_match_the_oracle(lead, n, width, chunk_size, causal):
    # widths where BLAS runs its real kernels (the property tests use 1-8), N not a
    # multiple of the block, one row (two segments on two threads, at N = 400 summing the
    # positions before the second in products of 120) and many
    q, k, v = random_qkv(11, n, width, width + 3, lead)
    dout = np.random.default_rng(12).standard_normal(v.shape)
    kw = dict(causal=causal, chunk_size=chunk_size)
    want = [linear_attention(q, k, v, method="quadratic", backend="numpy", **kw),
            *linear_attention_backward(dout, q, k, v, method="quadratic", backend="numpy",
                                       **kw)]
    got = run_sweeps(lead, n, width, chunk_size, fused=True, causal=causal)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n_segments", [2, 3, 7])
@pytest.mark.parametrize("causal", [True, False])
def test_segments_change_nothing(n_segments, causal, monkeypatch):
    # cut into segments, each starting from the sum of the segments before (or after, for
    # the backward-in-time sweep; of the whole row if not causal): the same numbers as one
    # unit per row
    def equal(n_segments):
        return lambda rows, blocks, causal: np.linspace(0, blocks, n_segments + 1).round(
        ).astype(int)

    monkeypatch.setattr(chunked, "segments", equal(1))
    want = run_sweeps((2,), 150, 24, 16, fused=False, causal=causal)
    monkeypatch.setattr(chunked, "segments", equal(n_segments))
    got = run_sweeps((2,), 150, 24, 16, fused=False, causal=causal)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("rows", [1, 2, 3, 8])
def test_segments_share_the_work_evenly(rows):
    threads = numba.get_num_threads()
    bounds = chunked.segments(rows, 128)
    assert bounds[0] == 0 and bounds[-1] == 128 and np.all(np.diff(bounds) > 0)
    assert (rows * (bounds.size - 1)) % threads == 0        # units in equal shares
    w = chunked.INCREMENT_COST
    work = w * bounds[:-1] + np.diff(bounds)                # sums before + own blocks
    assert work.max() - work.min() <= 1
    if bounds.size == 3:                                    # b_1 = w b_1 + (128 - b_1)
        assert bounds[1] == round(128 / (2 - w))
    flat = chunked.segments(rows, 128, causal=False)        # each sums the whole row first
    assert flat.size == bounds.size and flat[0] == 0 and flat[-1] == 128
    assert np.ptp(np.diff(flat)) <= 1


def test_block_length_keeps_every_product_on_one_blas_thread():
    assert chunked.block_length(64, 64, 64) == 64 and chunked.block_length(64, 8, 8) == 64
    c = chunked.block_length(64, 256, 256)
    assert c * 256 * 256 < chunked.SINGLE_THREAD_PRODUCT <= (c + 1) * 256 * 256
    assert chunked.block_length(1, 4096, 4096) == 1


def compiled_serially(function, *args):
    """``function`` (a Numba dispatcher or a plain function) compiled again, serially and
    uncached, for these arguments: its IR and assembly can be read."""
    serial = njit(error_model="numpy")(getattr(function, "py_func", function))
    serial(*args)
    return serial


def float64_in_ir(function, *args):
    """Whether the loop body of ``function`` (compiled serially, uncached) does any double
    arithmetic or conversion for these arguments."""
    ir = "\n".join(compiled_serially(function, *args).inspect_llvm().values())
    return any(op in ir for op in ("fadd double", "fmul double", "fdiv double", "fpext"))


@pytest.mark.slow
def test_float32_stays_float32_inside_the_loops():
    x = np.ones((2, 5, 4), np.float32)
    out, den, eps = np.empty_like(x), np.empty((2, 5), np.float32), np.float32(1e-6)
    none = np.empty((0, 0, 0), np.float32)
    assert not float64_in_ir(products.causal_product, x, x, x, False, eps, out, den, 1, none)
    assert not float64_in_ir(products.global_product, x, x, x, eps, out, den, 1)
    norms = np.empty((2, 5, 2), np.float32)
    for stage in (chunked.FORWARD, chunked.DQ, chunked.DKV):
        for causal in (True, False):
            assert not float64_in_ir(chunked.sweep, stage, causal, x, x, x, x, eps, True, out,
                                     norms, x.copy(), x.copy(), x.copy(), 2,
                                     np.array([0, 2, 3]), none, none)
    flat = x.reshape(-1)
    assert not float64_in_ir(elu.phi_into, flat, flat.copy())
    assert not float64_in_ir(elu._times_dphi_, flat, flat.copy())
    s, z = np.zeros((2, 4, 4), np.float32), np.zeros((2, 4), np.float32)
    row = np.ascontiguousarray(x[:, 0])
    assert not float64_in_ir(step.step_into, row, row, row, s, z, row.copy(), eps, True)
    assert not float64_in_ir(step.step_into_compensated, row, row, row, s, z, s.copy(),
                             z.copy(), row.copy(), eps, True)
    lse, delta, dq_parts = np.empty((2, 5), np.float32), np.empty((2, 5), np.float32), x[None]
    real = np.ones((2, 5), np.bool_)                          # a key mask: every key real
    assert not float64_in_ir(softmax._forward_unit, 1, x, x, x, x, real, True, eps, 2, 3, out,
                             lse, delta)
    assert not float64_in_ir(softmax._backward_unit, 1, x, x, x, x, real, lse, delta, True,
                             eps, 2, 3, dq_parts.copy(), x.copy(), x.copy())
    # the check can fail: the same loop given a float64 scalar computes in double
    assert float64_in_ir(products.causal_product, x, x, x, False, 1e-6, out, den, 1, none)


def masked_moves_in_asm(function, *args):
    """Whether ``function``, compiled serially and uncached for this CPU, moves data through
    AVX's masks (vmaskmovps, vpmaskmovd, ...): how LLVM stores only the elements a select
    changes, slow on AMD's Zen CPUs (see flash_tiles)."""
    return "maskmov" in "\n".join(compiled_serially(function, *args).inspect_asm().values())


def _running_max_by_select(St, top):
    """The pattern the kernels avoid: a running maximum kept by a select."""
    for b in range(St.shape[0]):
        row = St[b]
        for a in range(row.size):
            top[a] = row[a] if row[a] > top[a] else top[a]


def _chain_by_select(grad, x, phi):
    """The chain rule the kernels no longer write: grad *= 1 where x > 0, else phi."""
    for i in range(grad.shape[0]):
        for f in range(grad.shape[1]):
            grad[i, f] *= 1 if x[i, f] > 0 else phi[i, f]


@pytest.mark.slow
def test_running_maxima_and_elu_chains_store_every_element():
    from linattn.numba_cpu import block_ops, flash_tiles, lsh, quadratic
    St, top = np.ones((40, 24), np.float32), np.zeros(24, np.float32)
    if not masked_moves_in_asm(_running_max_by_select, St, top):
        pytest.skip("LLVM stores no select through AVX's masked moves on this CPU")
    # the checks can fail: both selects became masked moves (on AVX2; AVX-512 masks otherwise)
    assert masked_moves_in_asm(_chain_by_select, St.copy(), St, St.copy())
    one = np.float32(1)
    for causal in (True, False):
        assert not masked_moves_in_asm(flash_tiles.scale_and_max, St, one, causal, 0, 0, top)
        assert not masked_moves_in_asm(flash_tiles.scale_and_max_keys, St, one, causal, 0, 0,
                                      top, np.ones(40, np.bool_))
    assert not masked_moves_in_asm(lsh._column_max, St, top)
    for dtype in (np.float32, np.float64):
        grad, phi = np.ones((40, 24), dtype), np.ones((40, 24), dtype)
        assert not masked_moves_in_asm(block_ops.chain_elu, grad, phi, True)
        assert not masked_moves_in_asm(quadratic._chain_elu, grad, phi, True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_slope_from_the_features_is_the_slope(dtype):
    # d phi / dx read from phi (min(1, phi)) equals it read from x, at every kind of x
    x = np.array([-np.inf, -800.0, -104.0, -87.5, -30.0, -1.5, -1e-30, -0.0, 0.0, 1e-30,
                  1e-8, 0.7, 3.0, 1e30, np.inf, np.nan])
    x = np.concatenate([x, np.random.default_rng(5).standard_normal(400) * 20])
    x = x.astype(dtype)

    @njit
    def both(x, from_x, from_phi):
        for i in range(x.size):
            from_x[i] = elu.dphi(x[i])
            from_phi[i] = elu.dphi_from_phi(elu.phi(x[i]))

    from_x, from_phi = np.empty_like(x), np.empty_like(x)
    both(x, from_x, from_phi)
    np.testing.assert_array_equal(from_phi, from_x)          # NaN where NaN, else equal
    assert np.array_equal(np.signbit(from_phi), np.signbit(from_x))    # -0.0 too
    assert from_phi.dtype == dtype and np.isnan(from_phi[15]) and from_phi[13] == 1


CACHE_PROBE = """
import numpy as np
import linattn
from linattn.numba_cpu import products
q = np.ones((1, 4, 8, 3), np.float32)
linattn.linear_attention(q, q, q, causal=True, method="linear", backend="numba")
stats = products.causal_product.stats
print(sum(stats.cache_hits.values()), sum(stats.cache_misses.values()))
"""


@pytest.mark.slow
def test_a_second_process_loads_the_compiled_loops():
    for _ in range(2):  # the first run may compile (and save); the second must not
        run = subprocess.run([sys.executable, "-c", CACHE_PROBE], capture_output=True,
                             text=True, check=True)
    hits, misses = map(int, run.stdout.split())
    assert hits == 1 and misses == 0


def test_numba_names_the_methods_it_runs(monkeypatch):
    from linattn import dispatch
    table = {key: name for key, name in dispatch.TABLE.items()
             if key != ("linear", "quadratic", "numba")}
    monkeypatch.setattr(dispatch, "TABLE", table)  # Numba runs every method: take one away
    q, k, v = random_qkv(5, 5, 3, 2)
    with pytest.raises(ValueError, match="'quadratic' has no numba kernel.*linear, recurrent"):
        linear_attention(q, k, v, method="quadratic", backend="numba")


@pytest.mark.parametrize("causal", [False, True])
def test_softmax_float32_and_views(causal):
    from linattn import softmax_attention, softmax_attention_backward
    q, k, v = random_qkv(6, 300, 8, 12, (2,))
    views = q[:, ::-1], k[:, ::-1], v[:, ::-1, ::2]
    dout = np.random.default_rng(7).standard_normal((2, 300, 6)).astype(np.float32)
    want = softmax_attention(*(np.ascontiguousarray(x) for x in views), causal=causal,
                             backend="numpy")
    got = softmax_attention(*(x.astype(np.float32) for x in views), causal=causal,
                            backend="numba")
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    grads = softmax_attention_backward(dout, *views, causal=causal, backend="numba")
    oracle = softmax_attention_backward(dout, *views, causal=causal, backend="numpy")
    for g, w in zip(grads, oracle):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def test_lsh_float32_stays_float32_inside_the_loops():
    from linattn.numba_cpu import lsh, lsh_hash
    x = np.ones((2, 40, 4), np.float32)
    pre = lsh._prepare(x, n_hashes=2, chunk_size=4, n_buckets=None, causal=True, seed=0)
    windows = (pre.order[0], pre.length, pre.chunk, pre.has_other, 4)
    stats = (pre.scale, pre.log_meets, x[:, :, 0].copy(), x[:, :, 1].copy())
    for causal in (True, False):
        assert not float64_in_ir(lsh._forward_round, x, x, x, *windows, causal, *stats,
                                 x.copy())
        assert not float64_in_ir(lsh._backward_round, x, x, x, x, *windows, causal, *stats, 0,
                                 x.copy(), x.copy(), x.copy())
    assert not float64_in_ir(lsh._add_unit_keys_backward, x, x, x, stats[2])
    rotations_t = np.ones((1, 3, 4), np.float32)
    assert not float64_in_ir(lsh_hash.buckets, x, rotations_t, np.empty((1, 2, 40), np.int64))
