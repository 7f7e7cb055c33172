"""Batches of different lengths and states handed between forms: key padding (``key_mask``,
``key_lengths``) and initial / final states (``initial_state``, ``return_state``, ``dstate``)
of linear attention, and key padding of softmax attention.

What they promise, as properties: padding changes no real output and no real gradient, left
or right, whatever the padding holds; gradients reaching padded keys and values are exactly 0;
a row with no real key is finite; the parallel form's final state is the state of N steps;
two pieces with the state handed over are one pass, forward and backward; the new gradient
terms agree with central differences. Each holds on the NumPy forms (the oracle) and on the
Numba kernels (elu+1 fused, and relu applied before them), float64 and float32; the Numba
kernels run these calls themselves ("auto" picks them, nothing falls back to NumPy), and
"auto" skips a backend without an option while a named one without it says so."""
import importlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from linattn import (Recurrence, State, linear_attention, linear_attention_backward,
                     linear_attention_step, softmax_attention, softmax_attention_backward)
from linattn import dispatch

from helpers import assert_gradients_match, random_qkv

METHODS = ("quadratic", "linear", "chunked", "recurrent", "auto")
BACKENDS = ("numpy", pytest.param("numba", marks=pytest.mark.skipif(
    not dispatch.numba_imports(), reason="numba is not installed")))
DTYPES = (np.float64, np.float32)
# float64 as tight as rounding allows; float32 within a few hundred ulps of its own padded or
# pieced twin (blocks fall differently, sums run in another order)
TOL = {np.float64: dict(rtol=1e-10, atol=1e-12), np.float32: dict(rtol=2e-4, atol=2e-5)}
seeds = st.integers(0, 2**32 - 1)
few = settings(max_examples=15)      # drawn per backend and dtype: 4x the examples


def close(got, want, dtype=np.float64):
    np.testing.assert_allclose(got, want, **TOL[dtype])


def padded_batch(rng, lengths, width, d, m, left, fill):
    """q, k, v (B, width, .) holding each sequence at its real positions and ``fill`` (a
    function of a shape) elsewhere, the mask (B, width), and the sequences alone."""
    b = len(lengths)
    q, k, v = fill((b, width, d)), fill((b, width, d)), fill((b, width, m))
    mask = np.zeros((b, width), bool)
    alone = []
    for i, n in enumerate(lengths):
        seq = [rng.standard_normal((n, w)) for w in (d, d, m)]
        real = slice(width - n, width) if left else slice(0, n)
        for x, s in zip((q, k, v), seq):
            x[i, real] = s
        mask[i, real] = True
        alone.append(seq)
    return q, k, v, mask, alone


def _alone_rows(x, i, n, width, left):
    return x[i, width - n:] if left else x[i, :n]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@few
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=3), extra=st.integers(0, 4),
       left=st.booleans(), causal=st.booleans(), method=st.sampled_from(METHODS),
       fmap=st.sampled_from(["elu+1", "relu"]), seed=seeds)
def test_padding_changes_no_real_output_and_no_real_gradient(backend, dtype, lengths, extra,
                                                             left, causal, method, fmap, seed):
    rng = np.random.default_rng(seed)
    width = max(lengths) + extra
    garbage = lambda shape: 50 * rng.standard_normal(shape)       # finite: queries read it
    q, k, v, mask, alone = padded_batch(rng, lengths, width, 3, 2, left, garbage)
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    kw = dict(causal=causal, method=method, backend=backend, chunk_size=3, feature_map=fmap)
    out = linear_attention(q, k, v, key_mask=mask, **kw)
    dout = np.where(mask[..., None], rng.standard_normal(out.shape), 0).astype(dtype)
    dq, dk, dv = linear_attention_backward(dout, q, k, v, key_mask=mask, **kw)
    assert np.all(dk[~mask] == 0) and np.all(dv[~mask] == 0)      # exactly, not nearly
    for i, (n, seq) in enumerate(zip(lengths, alone)):
        qa, ka, va = (x.astype(dtype) for x in seq)
        rows = lambda x: _alone_rows(x, i, n, width, left)
        close(rows(out), linear_attention(qa, ka, va, **kw), dtype)
        want = linear_attention_backward(rows(dout), qa, ka, va, **kw)
        for got, w in zip((dq, dk, dv), want):
            close(rows(got), w, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@few
@given(n_q=st.integers(1, 6), n_k=st.integers(1, 8), pad=st.integers(1, 4),
       method=st.sampled_from(METHODS), fmap=st.sampled_from(["elu+1", "relu"]), seed=seeds)
def test_padded_keys_may_hold_nan_in_cross_attention(backend, n_q, n_k, pad, method, fmap,
                                                     seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_q, 3))
    k, v = rng.standard_normal((n_k, 3)), rng.standard_normal((n_k, 2))
    k_pad = np.concatenate([k, np.full((pad, 3), np.nan)])
    v_pad = np.concatenate([v, np.full((pad, 2), np.inf)])
    kw = dict(method=method, backend=backend, chunk_size=3, feature_map=fmap)
    lengths = np.array(n_k)
    np.testing.assert_allclose(linear_attention(q, k_pad, v_pad, key_lengths=lengths, **kw),
                               linear_attention(q, k, v, **kw), rtol=1e-10, atol=1e-12)
    dout = rng.standard_normal((n_q, 2))
    got = linear_attention_backward(dout, q, k_pad, v_pad, key_lengths=lengths, **kw)
    want = linear_attention_backward(dout, q, k, v, **kw)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g[:len(w)], w, rtol=1e-10, atol=1e-12)
    assert np.all(got[1][n_k:] == 0) and np.all(got[2][n_k:] == 0)
    np.testing.assert_allclose(softmax_attention(q, k_pad, v_pad, key_lengths=lengths,
                                                 backend=backend),
                               softmax_attention(q, k, v, backend="numpy"), rtol=1e-10)
    got = softmax_attention_backward(dout, q, k_pad, v_pad, key_lengths=lengths,
                                     backend=backend)
    want = softmax_attention_backward(dout, q, k, v, backend="numpy")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g[:len(w)], w, rtol=1e-10, atol=1e-12)
    assert np.all(got[1][n_k:] == 0) and np.all(got[2][n_k:] == 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_row_with_no_real_key_is_zero_and_its_gradients_finite(backend, method, causal,
                                                                  dtype):
    q, k, v = random_qkv(3, 5, 3, 2, (2,), dtype)
    k[0], v[0] = np.nan, -np.inf                  # the empty row's padding: anything at all
    lengths = np.array([0, 5])
    kw = dict(causal=causal, backend=backend, key_lengths=lengths)
    out = linear_attention(q, k, v, method=method, **kw)
    assert out.dtype == dtype and np.all(out[0] == 0) and np.all(np.isfinite(out))
    grads = linear_attention_backward(np.ones_like(out), q, k, v, method=method, **kw)
    assert all(np.all(np.isfinite(g)) and g.dtype == dtype for g in grads)
    assert np.all(grads[1][0] == 0) and np.all(grads[2][0] == 0)
    out = softmax_attention(q, k, v, **kw)
    assert out.dtype == dtype and np.all(out[0] == 0) and np.all(np.isfinite(out))
    grads = softmax_attention_backward(np.ones_like(out), q, k, v, **kw)
    assert all(np.all(g[0] == 0) and np.all(np.isfinite(g)) for g in grads)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@few
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=3), extra=st.integers(0, 4),
       left=st.booleans(), causal=st.booleans(), seed=seeds)
def test_softmax_padding_changes_no_real_output_and_no_real_gradient(backend, dtype, lengths,
                                                                     extra, left, causal, seed):
    rng = np.random.default_rng(seed)
    width = max(lengths) + extra
    q, k, v, mask, alone = padded_batch(rng, lengths, width, 3, 2, left,
                                        lambda shape: 50 * rng.standard_normal(shape))
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    kw = dict(causal=causal, backend=backend)
    out = softmax_attention(q, k, v, key_mask=mask, **kw)
    dout = np.where(mask[..., None], rng.standard_normal(out.shape), 0).astype(dtype)
    dq, dk, dv = softmax_attention_backward(dout, q, k, v, key_mask=mask, **kw)
    assert np.all(dk[~mask] == 0) and np.all(dv[~mask] == 0)
    for i, (n, seq) in enumerate(zip(lengths, alone)):
        qa, ka, va = (x.astype(dtype) for x in seq)
        rows = lambda x: _alone_rows(x, i, n, width, left)
        close(rows(out), softmax_attention(qa, ka, va, **kw), dtype)
        want = softmax_attention_backward(rows(dout), qa, ka, va, **kw)
        for got, w in zip((dq, dk, dv), want):
            close(rows(got), w, dtype)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 7, 70, 150])
def test_numba_softmax_with_padding_and_large_logits_is_numpys(n, causal):
    # logits in the thousands (exp overflows past 709), keys padded across tile edges and
    # one sequence with no real key: the online softmax's shifts keep every number finite
    pytest.importorskip("numba")
    rng = np.random.default_rng(n)
    q, k, v = random_qkv(n, n, 3, 2, (3,))
    q *= 2000
    mask = rng.random((3, n)) < 0.6
    mask[0] = False
    k[~mask], v[~mask] = np.nan, np.inf
    dout = rng.standard_normal((3, n, 2))
    kw = dict(causal=causal, key_mask=mask)
    out = softmax_attention(q, k, v, backend="numba", **kw)
    assert np.all(np.isfinite(out)) and np.all(out[0] == 0)
    np.testing.assert_allclose(out, softmax_attention(q, k, v, backend="numpy", **kw),
                               rtol=1e-10, atol=1e-12)
    got = softmax_attention_backward(dout, q, k, v, backend="numba", **kw)
    want = softmax_attention_backward(dout, q, k, v, backend="numpy", **kw)
    for g, w in zip(got, want):        # saturated rows: gradients near 0 by cancellation,
        assert np.all(np.isfinite(g))  # each term exact to |logit| ulps, 2000 x 1e-16
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-10 * max(1, np.max(np.abs(w))))


@pytest.mark.parametrize("backend", BACKENDS)
@few
@given(n=st.integers(1, 9), causal=st.booleans(), seed=seeds)
def test_mask_and_lengths_agree(backend, n, causal, seed):
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(seed, n, 3, 2, (3, 2))
    lengths = rng.integers(0, n + 1, size=(3, 1))                 # broadcast over 2 heads
    mask = np.arange(n) < lengths[..., None]                      # (3, 1, n) -> (3, 2, n)
    for method in METHODS:
        kw = dict(causal=causal, method=method, backend=backend)
        np.testing.assert_array_equal(linear_attention(q, k, v, key_mask=mask, **kw),
                                      linear_attention(q, k, v, key_lengths=lengths, **kw))
        np.testing.assert_allclose(linear_attention(q, k, v, key_mask=mask, **kw),
                                   linear_attention(q, k, v, key_mask=mask, causal=causal,
                                                    method="quadratic", backend="numpy"),
                                   rtol=1e-10, atol=1e-12)
    kw = dict(causal=causal, backend=backend)
    np.testing.assert_array_equal(softmax_attention(q, k, v, key_mask=mask, **kw),
                                  softmax_attention(q, k, v, key_lengths=lengths, **kw))


def random_state(rng, lead, f, m, dtype=np.float64):
    """A state as earlier positions leave it: positive normaliser, any numerator."""
    return State(rng.standard_normal((*lead, f, m)).astype(dtype),
                 (rng.random((*lead, f)) + 0.5).astype(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@few
@given(n=st.integers(1, 12), lead=st.sampled_from([(), (2,), (2, 3)]),
       method=st.sampled_from(METHODS), start=st.booleans(),
       fmap=st.sampled_from(["elu+1", "relu"]), seed=seeds)
def test_the_final_state_is_the_state_of_n_steps(backend, dtype, n, lead, method, start, fmap,
                                                 seed):
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(seed, n, 3, 2, lead, dtype)
    state = random_state(rng, lead, 3, 2, dtype) if start else None
    out, final = linear_attention(q, k, v, causal=True, method=method, backend=backend,
                                  feature_map=fmap, initial_state=state, return_state=True,
                                  chunk_size=5)
    assert final.S.dtype == dtype and final.z.dtype == dtype
    for i in range(n):
        out_i, state = linear_attention_step(q[..., i, :], k[..., i, :], v[..., i, :], state,
                                             backend="numpy", feature_map=fmap)
        close(out[..., i, :], out_i, dtype)
    for got, want in zip(final, state):
        close(got, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@few
@given(n=st.integers(2, 14), cut=st.integers(1, 13), lead=st.sampled_from([(), (2,)]),
       method=st.sampled_from(METHODS), padded=st.booleans(),
       fmap=st.sampled_from(["elu+1", "relu"]), seed=seeds)
def test_two_pieces_with_the_state_handed_over_are_one_pass(backend, dtype, n, cut, lead,
                                                            method, padded, fmap, seed):
    cut = min(cut, n - 1)
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(seed, n, 3, 2, lead, dtype)
    s0 = random_state(rng, lead, 3, 2, dtype)
    mask = rng.random((*lead, n)) < 0.7 if padded else None      # holes anywhere
    if padded:
        k[~mask], v[~mask] = np.nan, np.inf                       # what padding holds: ignored
    kw = dict(causal=True, method=method, backend=backend, chunk_size=3, feature_map=fmap)
    piece = lambda x, part: None if x is None else x[..., part]
    first, second = slice(0, cut), slice(cut, n)
    rows = lambda x, part: x[..., part, :]
    out, final = linear_attention(q, k, v, key_mask=mask, initial_state=s0,
                                  return_state=True, **kw)
    out1, s1 = linear_attention(*(rows(x, first) for x in (q, k, v)),
                                key_mask=piece(mask, first), initial_state=s0,
                                return_state=True, **kw)
    out2, s2 = linear_attention(*(rows(x, second) for x in (q, k, v)),
                                key_mask=piece(mask, second), initial_state=s1,
                                return_state=True, **kw)
    close(np.concatenate([out1, out2], axis=-2), out, dtype)
    for got, want in zip(s2, final):
        close(got, want, dtype)
    # backward: the second piece first, handing d(its initial state) to the first as dstate
    dout = rng.standard_normal(out.shape).astype(dtype)
    dfinal = random_state(rng, lead, 3, 2, dtype)
    want = linear_attention_backward(dout, q, k, v, key_mask=mask, initial_state=s0,
                                     dstate=dfinal, **kw)
    *g2, ds1 = linear_attention_backward(rows(dout, second),
                                         *(rows(x, second) for x in (q, k, v)),
                                         key_mask=piece(mask, second), initial_state=s1,
                                         dstate=dfinal, **kw)
    *g1, ds0 = linear_attention_backward(rows(dout, first),
                                         *(rows(x, first) for x in (q, k, v)),
                                         key_mask=piece(mask, first), initial_state=s0,
                                         dstate=ds1, **kw)
    for a, b, w in zip(g1, g2, want[:3]):
        close(np.concatenate([a, b], axis=-2), w, dtype)
    for got, w in zip(ds0, want[3]):
        close(got, w, dtype)
    if padded:
        assert all(np.all(g[~mask] == 0) for g in want[1:3])
    # and the one pass is the oracle's, outputs, final state and every gradient
    oracle = dict(kw, method="quadratic", backend="numpy")
    want_out, want_final = linear_attention(q, k, v, key_mask=mask, initial_state=s0,
                                            return_state=True, **oracle)
    want_grads = linear_attention_backward(dout, q, k, v, key_mask=mask, initial_state=s0,
                                           dstate=dfinal, **oracle)
    for got, w in zip((out, *final, *want[:3], *want[3]),
                      (want_out, *want_final, *want_grads[:3], *want_grads[3])):
        close(got, w, dtype)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_state_gradients_match_central_differences(backend, method, padded):
    """f(q, k, v, S0, z0) = [out, S_N, z_N] flattened: every new term of the backward,
    d(S0, z0) and the final state's gradient (dstate) reaching q, k and v."""
    rng = np.random.default_rng(7)
    q, k, v = random_qkv(7, 5, 3, 2, (2,))
    s0 = random_state(rng, (2,), 3, 2)
    mask = np.array([[True, False, True, True, False], [False, True, True, True, True]])
    kw = dict(causal=True, method=method, backend=backend, chunk_size=2,
              key_mask=mask if padded else None)

    def f(q, k, v, s, z):
        out, final = linear_attention(q, k, v, initial_state=State(s, z), return_state=True,
                                      **kw)
        return np.concatenate([out.ravel(), final.S.ravel(), final.z.ravel()])

    def f_backward(d, q, k, v, s, z):
        n_out = v.size                                  # out has v's shape here (Nq = Nk)
        dout = d[:n_out].reshape(v.shape)
        dstate = State(d[n_out:n_out + s.size].reshape(s.shape),
                       d[n_out + s.size:].reshape(z.shape))
        dq, dk, dv, ds0 = linear_attention_backward(dout, q, k, v, initial_state=State(s, z),
                                                    dstate=dstate, **kw)
        return dq, dk, dv, ds0.S, ds0.z

    assert_gradients_match(f, f_backward, [q, k, v, s0.S, s0.z])


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-5), (np.float64, 1e-10)])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_states_keep_the_compute_dtype(backend, method, dtype, rtol):
    q, k, v = random_qkv(2, 6, 3, 2, (2,), dtype)
    rng = np.random.default_rng(2)
    s0 = random_state(rng, (2,), 3, 2, dtype)
    out, final = linear_attention(q, k, v, causal=True, method=method, backend=backend,
                                  initial_state=s0, return_state=True)
    assert out.dtype == dtype and final.S.dtype == dtype and final.z.dtype == dtype
    want, want_final = linear_attention(*(x.astype(np.float64) for x in (q, k, v)),
                                        causal=True, method="quadratic",
                                        initial_state=s0, return_state=True)
    np.testing.assert_allclose(out, want, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(final.S, want_final.S, rtol=rtol, atol=rtol)
    *grads, ds0 = linear_attention_backward(np.ones_like(out), q, k, v, causal=True,
                                            method=method, backend=backend, initial_state=s0)
    assert all(g.dtype == dtype for g in grads) and ds0.S.dtype == dtype


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_a_recurrence_continues_the_parallel_forms_state(backend):
    q, k, v = random_qkv(5, 9, 4, 3, (2,))
    want = linear_attention(q, k, v, causal=True, backend="numpy")
    _, prompt = linear_attention(q[:, :5], k[:, :5], v[:, :5], causal=True, return_state=True)
    rnn = Recurrence((2,), 4, 3, dtype="float64", backend=backend, initial_state=prompt)
    for i in range(5, 9):
        np.testing.assert_allclose(rnn.step(q[:, i], k[:, i], v[:, i]), want[:, i],
                                   rtol=1e-10)
    assert prompt.S.flags.writeable and not np.shares_memory(rnn.state.S, prompt.S)


@pytest.mark.parametrize("causal, shape, want", [
    (True, (6, 3), "quadratic"), (True, (200, 3), "chunked"), (False, (6, 3), "quadratic"),
    (False, (200, 3), "chunked")])
def test_masked_and_stateful_calls_resolve_to_numbas_kernels(causal, shape, want):
    pytest.importorskip("numba")
    options = dict(key_mask=np.ones(shape[0], bool))
    if causal:
        options.update(initial_state=True, return_state=True)
    needs = dispatch.needed(causal=causal, **options)
    module, backend = dispatch.kernel("linear", "auto", "auto", np, causal, shape, needs)
    assert (module.__name__, backend) == (f"linattn.numba_cpu.{want}", "numba")
    for method, name in (("linear", "loops"), ("recurrent", "loops"), ("chunked", "chunked"),
                         ("quadratic", "quadratic")):
        module, _ = dispatch.kernel("linear", method, "numba", np, causal, shape, needs)
        assert module.__name__ == f"linattn.numba_cpu.{name}"
    module, backend = dispatch.kernel("softmax", "auto", "auto", np, needs=dispatch.needed(
        causal=causal, key_mask=options["key_mask"]))
    assert (module.__name__, backend) == ("linattn.numba_cpu.softmax", "numba")


NUMPY_FORMS = ("quadratic", "cumulative", "chunked", "recurrent", "softmax")


@pytest.mark.parametrize("method", METHODS)
def test_numba_runs_masks_and_states_itself_with_numpys_forms_out_of_reach(method,
                                                                             monkeypatch):
    """Every NumPy form made to fail: a silent fallback to NumPy would raise here."""
    pytest.importorskip("numba")
    rng = np.random.default_rng(11)
    q, k, v = random_qkv(11, 9, 3, 2, (2,))
    mask, s0 = np.arange(9) < np.array([[9], [5]]), random_state(rng, (2,), 3, 2)
    kw = dict(causal=True, method=method, key_mask=mask, initial_state=s0)
    dout, dfinal = rng.standard_normal(v.shape), random_state(rng, (2,), 3, 2)
    want_out, want_final = linear_attention(q, k, v, backend="numpy", return_state=True, **kw)
    want_grads = linear_attention_backward(dout, q, k, v, backend="numpy", dstate=dfinal, **kw)
    want_soft = softmax_attention_backward(dout, q, k, v, causal=True, key_mask=mask,
                                           backend="numpy")

    def unreachable(*args, **kwargs):
        raise AssertionError("a NumPy form ran")
    for name in NUMPY_FORMS:
        module = importlib.import_module(f"linattn.forms.{name}")
        monkeypatch.setattr(module, "attend", unreachable)
        monkeypatch.setattr(module, "attend_backward", unreachable)
    for backend in ("auto", "numba"):
        out, final = linear_attention(q, k, v, backend=backend, return_state=True, **kw)
        grads = linear_attention_backward(dout, q, k, v, backend=backend, dstate=dfinal, **kw)
        for got, w in zip((out, *final, *grads[:3], *grads[3]),
                          (want_out, *want_final, *want_grads[:3], *want_grads[3])):
            close(got, w)
        soft = softmax_attention_backward(dout, q, k, v, causal=True, key_mask=mask,
                                          backend=backend)
        for got, w in zip(soft, want_soft):
            close(got, w)


@pytest.mark.parametrize("option", [dict(key_mask=np.arange(6) < 4),
                                    dict(key_lengths=np.array(4)),
                                    dict(causal=True, return_state=True),
                                    dict(causal=True, initial_state=State(np.zeros((3, 2)),
                                                                          np.zeros(3)))])
def test_a_named_backend_without_an_option_is_a_value_error_naming_it(option, monkeypatch):
    """The rule every new option follows: Numba's linear and softmax modules declared
    without the options here, as they were before they had them."""
    pytest.importorskip("numba")
    from linattn.numba_cpu import chunked, loops, quadratic, softmax
    for module in (chunked, loops, quadratic, softmax):
        monkeypatch.setattr(module, "SUPPORTS", frozenset({"non_causal"}))
    q, k, v = random_qkv(1, 6, 3, 2)
    name = next(n for n in option if n != "causal").replace("key_lengths", "key_mask")
    with pytest.raises(ValueError, match=f"'numba'.*{name}"):
        linear_attention(q, k, v, backend="numba", **option)
    flat = lambda result: [result[0], *result[1]] if isinstance(result, tuple) else [result]
    got, want = (linear_attention(q, k, v, backend=b, **option) for b in ("auto", "numpy"))
    for g, w in zip(flat(got), flat(want)):             # "auto": NumPy's form
        np.testing.assert_array_equal(g, w)
    if "key" in name:
        with pytest.raises(ValueError, match=f"'numba'.*{name}"):
            softmax_attention(q, k, v, backend="numba", **option)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(key_mask=np.ones(6, bool), key_lengths=np.array(6)), ValueError, "not both"),
    (dict(key_mask=np.ones(6)), TypeError, "key_mask must be a boolean"),
    (dict(key_mask=np.ones(5, bool)), ValueError, r"key_mask must have a shape.*\(6,\)"),
    (dict(key_lengths=np.array(7)), ValueError, "key_lengths must lie in 0..Nk"),
    (dict(key_lengths=np.array(2.0)), TypeError, "key_lengths must be an integer"),
    (dict(initial_state=State(np.zeros((3, 2)), np.zeros(3))), ValueError, "causal=True"),
    (dict(return_state=True), ValueError, "causal=True"),
    (dict(causal=True, return_state=1), TypeError, "return_state must be True or False"),
    (dict(causal=True, initial_state=State(np.zeros((2, 2)), np.zeros(2))), ValueError,
     r"initial_state must be State\(S \(3, 2\)"),
])
def test_bad_padding_and_state_arguments_are_named(kwargs, error, match):
    q, k, v = random_qkv(1, 6, 3, 2)
    with pytest.raises(error, match=match):
        linear_attention(q, k, v, **kwargs)


def test_on_the_gpu_masks_and_states_run_through_numpys_forms():
    cp = pytest.importorskip("cupy")
    try:
        cp.cuda.runtime.getDeviceCount()
    except Exception:                     # CuPy's runtime error: no driver or no device
        pytest.skip("no GPU")
    q, k, v = random_qkv(4, 9, 3, 2, (2,))
    mask = np.arange(9) < np.array([[6], [9]])
    s0 = random_state(np.random.default_rng(4), (2,), 3, 2)
    kw = dict(causal=True, key_mask=mask, initial_state=s0, return_state=True)
    want, want_state = linear_attention(q, k, v, backend="numpy", **kw)
    on_gpu = dict(kw, key_mask=cp.asarray(mask), initial_state=State(*map(cp.asarray, s0)))
    for method in ("auto", "linear", "chunked"):
        out, state = linear_attention(*map(cp.asarray, (q, k, v)), method=method, **on_gpu)
        np.testing.assert_allclose(cp.asnumpy(out), want, rtol=1e-10)
        np.testing.assert_allclose(cp.asnumpy(state.S), want_state.S, rtol=1e-10)
    np.testing.assert_allclose(
        cp.asnumpy(softmax_attention(*map(cp.asarray, (q, k, v)), key_mask=cp.asarray(mask))),
        softmax_attention(q, k, v, key_mask=mask), rtol=1e-10)
