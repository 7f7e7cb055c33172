"""Batches of different lengths and states handed between forms: key padding (``key_mask``,
``key_lengths``) and initial / final states (``initial_state``, ``return_state``, ``dstate``)
of linear attention, and key padding of softmax attention.

What they promise, as properties: padding changes no real output and no real gradient, left
or right, whatever the padding holds; gradients reaching padded keys and values are exactly 0;
a row with no real key is finite; the parallel form's final state is the state of N steps;
two pieces with the state handed over are one pass, forward and backward; the new gradient
terms agree with central differences; "auto" finds a backend with the option and a named
backend without it says so."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from linattn import (Recurrence, State, linear_attention, linear_attention_backward,
                     linear_attention_step, softmax_attention, softmax_attention_backward)
from linattn import dispatch

from helpers import assert_gradients_match, random_qkv

METHODS = ("quadratic", "linear", "chunked", "recurrent", "auto")
seeds = st.integers(0, 2**32 - 1)


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


@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=3), extra=st.integers(0, 4),
       left=st.booleans(), causal=st.booleans(), method=st.sampled_from(METHODS), seed=seeds)
def test_padding_changes_no_real_output_and_no_real_gradient(lengths, extra, left, causal,
                                                             method, seed):
    rng = np.random.default_rng(seed)
    width = max(lengths) + extra
    garbage = lambda shape: 50 * rng.standard_normal(shape)       # finite: queries read it
    q, k, v, mask, alone = padded_batch(rng, lengths, width, 3, 2, left, garbage)
    kw = dict(causal=causal, method=method, backend="numpy", chunk_size=3)
    out = linear_attention(q, k, v, key_mask=mask, **kw)
    dout = np.where(mask[..., None], rng.standard_normal(out.shape), 0)  # a loss on real rows
    dq, dk, dv = linear_attention_backward(dout, q, k, v, key_mask=mask, **kw)
    assert np.all(dk[~mask] == 0) and np.all(dv[~mask] == 0)      # exactly, not nearly
    for i, (n, (qa, ka, va)) in enumerate(zip(lengths, alone)):
        rows = lambda x: _alone_rows(x, i, n, width, left)
        np.testing.assert_allclose(rows(out), linear_attention(qa, ka, va, **kw),
                                   rtol=1e-10, atol=1e-12)
        want = linear_attention_backward(rows(dout), qa, ka, va, **kw)
        for got, w in zip((dq, dk, dv), want):
            np.testing.assert_allclose(rows(got), w, rtol=1e-10, atol=1e-12)


@given(n_q=st.integers(1, 6), n_k=st.integers(1, 8), pad=st.integers(1, 4),
       method=st.sampled_from(METHODS), seed=seeds)
def test_padded_keys_may_hold_nan_in_cross_attention(n_q, n_k, pad, method, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_q, 3))
    k, v = rng.standard_normal((n_k, 3)), rng.standard_normal((n_k, 2))
    k_pad = np.concatenate([k, np.full((pad, 3), np.nan)])
    v_pad = np.concatenate([v, np.full((pad, 2), np.inf)])
    kw = dict(method=method, backend="numpy", chunk_size=3)
    lengths = np.array(n_k)
    np.testing.assert_allclose(linear_attention(q, k_pad, v_pad, key_lengths=lengths, **kw),
                               linear_attention(q, k, v, **kw), rtol=1e-10, atol=1e-12)
    dout = rng.standard_normal((n_q, 2))
    got = linear_attention_backward(dout, q, k_pad, v_pad, key_lengths=lengths, **kw)
    want = linear_attention_backward(dout, q, k, v, **kw)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g[:len(w)], w, rtol=1e-10, atol=1e-12)
    assert np.all(got[1][n_k:] == 0) and np.all(got[2][n_k:] == 0)
    np.testing.assert_allclose(softmax_attention(q, k_pad, v_pad, key_lengths=lengths),
                               softmax_attention(q, k, v, backend="numpy"), rtol=1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("method", METHODS)
def test_a_row_with_no_real_key_is_zero_and_its_gradients_finite(method, causal, dtype):
    q, k, v = random_qkv(3, 5, 3, 2, (2,), dtype)
    lengths = np.array([0, 5])
    out = linear_attention(q, k, v, causal=causal, method=method, key_lengths=lengths)
    assert out.dtype == dtype and np.all(out[0] == 0) and np.all(np.isfinite(out))
    grads = linear_attention_backward(np.ones_like(out), q, k, v, causal=causal, method=method,
                                      key_lengths=lengths)
    assert all(np.all(np.isfinite(g)) and g.dtype == dtype for g in grads)
    out = softmax_attention(q, k, v, causal=causal, key_lengths=lengths)
    assert out.dtype == dtype and np.all(out[0] == 0) and np.all(np.isfinite(out))
    grads = softmax_attention_backward(np.ones_like(out), q, k, v, causal=causal,
                                       key_lengths=lengths)
    assert all(np.all(g[0] == 0) and np.all(np.isfinite(g)) for g in grads)


@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=3), extra=st.integers(0, 4),
       left=st.booleans(), causal=st.booleans(), seed=seeds)
def test_softmax_padding_changes_no_real_output_and_no_real_gradient(lengths, extra, left,
                                                                     causal, seed):
    rng = np.random.default_rng(seed)
    width = max(lengths) + extra
    q, k, v, mask, alone = padded_batch(rng, lengths, width, 3, 2, left,
                                        lambda shape: 50 * rng.standard_normal(shape))
    out = softmax_attention(q, k, v, causal=causal, key_mask=mask)
    dout = np.where(mask[..., None], rng.standard_normal(out.shape), 0)
    dq, dk, dv = softmax_attention_backward(dout, q, k, v, causal=causal, key_mask=mask)
    assert np.all(dk[~mask] == 0) and np.all(dv[~mask] == 0)
    for i, (n, (qa, ka, va)) in enumerate(zip(lengths, alone)):
        rows = lambda x: _alone_rows(x, i, n, width, left)
        np.testing.assert_allclose(rows(out), softmax_attention(qa, ka, va, causal=causal),
                                   rtol=1e-10, atol=1e-12)
        want = softmax_attention_backward(rows(dout), qa, ka, va, causal=causal)
        for got, w in zip((dq, dk, dv), want):
            np.testing.assert_allclose(rows(got), w, rtol=1e-10, atol=1e-12)


@given(n=st.integers(1, 9), causal=st.booleans(), seed=seeds)
def test_mask_and_lengths_agree(n, causal, seed):
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(seed, n, 3, 2, (3, 2))
    lengths = rng.integers(0, n + 1, size=(3, 1))                 # broadcast over 2 heads
    mask = np.arange(n) < lengths[..., None]                      # (3, 1, n) -> (3, 2, n)
    for method in METHODS:
        kw = dict(causal=causal, method=method, backend="numpy")
        np.testing.assert_array_equal(linear_attention(q, k, v, key_mask=mask, **kw),
                                      linear_attention(q, k, v, key_lengths=lengths, **kw))
    np.testing.assert_array_equal(softmax_attention(q, k, v, key_mask=mask),
                                  softmax_attention(q, k, v, key_lengths=lengths))


def random_state(rng, lead, f, m):
    """A state as earlier positions leave it: positive normaliser, any numerator."""
    return State(rng.standard_normal((*lead, f, m)), rng.random((*lead, f)) + 0.5)


@given(n=st.integers(1, 12), lead=st.sampled_from([(), (2,), (2, 3)]),
       method=st.sampled_from(METHODS), start=st.booleans(), seed=seeds)
def test_the_final_state_is_the_state_of_n_steps(n, lead, method, start, seed):
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(seed, n, 3, 2, lead)
    state = random_state(rng, lead, 3, 2) if start else None
    out, final = linear_attention(q, k, v, causal=True, method=method, backend="numpy",
                                  initial_state=state, return_state=True)
    for i in range(n):
        out_i, state = linear_attention_step(q[..., i, :], k[..., i, :], v[..., i, :], state,
                                             backend="numpy")
        np.testing.assert_allclose(out[..., i, :], out_i, rtol=1e-10, atol=1e-12)
    for got, want in zip(final, state):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@given(n=st.integers(2, 14), cut=st.integers(1, 13), lead=st.sampled_from([(), (2,)]),
       method=st.sampled_from(METHODS), padded=st.booleans(), seed=seeds)
def test_two_pieces_with_the_state_handed_over_are_one_pass(n, cut, lead, method, padded,
                                                            seed):
    cut = min(cut, n - 1)
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(seed, n, 3, 2, lead)
    s0 = random_state(rng, lead, 3, 2)
    mask = rng.random((*lead, n)) < 0.7 if padded else None      # holes anywhere
    kw = dict(causal=True, method=method, backend="numpy", chunk_size=3)
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
    np.testing.assert_allclose(np.concatenate([out1, out2], axis=-2), out, rtol=1e-10,
                               atol=1e-12)
    for got, want in zip(s2, final):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    # backward: the second piece first, handing d(its initial state) to the first as dstate
    dout, dfinal = rng.standard_normal(out.shape), random_state(rng, lead, 3, 2)
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
        np.testing.assert_allclose(np.concatenate([a, b], axis=-2), w, rtol=1e-10, atol=1e-12)
    for got, w in zip(ds0, want[3]):
        np.testing.assert_allclose(got, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("padded", [False, True])
def test_state_gradients_match_central_differences(method, padded):
    """f(q, k, v, S0, z0) = [out, S_N, z_N] flattened: every new term of the backward,
    d(S0, z0) and the final state's gradient (dstate) reaching q, k and v."""
    rng = np.random.default_rng(7)
    q, k, v = random_qkv(7, 5, 3, 2, (2,))
    s0 = random_state(rng, (2,), 3, 2)
    mask = np.array([[True, False, True, True, False], [False, True, True, True, True]])
    kw = dict(causal=True, method=method, backend="numpy", chunk_size=2,
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
def test_states_keep_the_compute_dtype(method, dtype, rtol):
    q, k, v = random_qkv(2, 6, 3, 2, (2,), dtype)
    rng = np.random.default_rng(2)
    s0 = State(*(a.astype(dtype) for a in random_state(rng, (2,), 3, 2)))
    out, final = linear_attention(q, k, v, causal=True, method=method, initial_state=s0,
                                  return_state=True)
    assert out.dtype == dtype and final.S.dtype == dtype and final.z.dtype == dtype
    want, want_final = linear_attention(*(x.astype(np.float64) for x in (q, k, v)),
                                        causal=True, method="quadratic",
                                        initial_state=s0, return_state=True)
    np.testing.assert_allclose(out, want, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(final.S, want_final.S, rtol=rtol, atol=rtol)
    *grads, ds0 = linear_attention_backward(np.ones_like(out), q, k, v, causal=True,
                                            method=method, initial_state=s0)
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


def test_masked_calls_resolve_to_a_backend_that_has_the_mask():
    q, k, v = random_qkv(1, 6, 3, 2)
    mask = np.arange(6) < 4
    needs = dispatch.needed(causal=True, key_mask=mask)
    module, backend = dispatch.kernel("linear", "auto", "auto", np, True, (6, 3), needs)
    assert backend == "numpy" and "key_mask" in module.SUPPORTS
    module, backend = dispatch.kernel("softmax", "auto", "auto", np, needs=needs)
    assert backend == "numpy" and "key_mask" in module.SUPPORTS
    np.testing.assert_array_equal(linear_attention(q, k, v, key_mask=mask),
                                  linear_attention(q, k, v, key_mask=mask, backend="numpy"))


@pytest.mark.parametrize("option", [dict(key_mask=np.arange(6) < 4),
                                    dict(key_lengths=np.array(4)),
                                    dict(causal=True, return_state=True),
                                    dict(causal=True, initial_state=State(np.zeros((3, 2)),
                                                                          np.zeros(3)))])
def test_numba_with_an_option_it_lacks_is_a_value_error_naming_it(option):
    pytest.importorskip("numba")
    q, k, v = random_qkv(1, 6, 3, 2)
    name = next(n for n in option if n != "causal").replace("key_lengths", "key_mask")
    with pytest.raises(ValueError, match=f"'numba'.*{name}"):
        linear_attention(q, k, v, backend="numba", **option)
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
