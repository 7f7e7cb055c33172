"""Decayed and gated causal linear attention (``forms.decay``, ``forms.decay_recurrent``,
``forms.decay_chunked`` behind ``linear_attention``'s ``decay``, ``log_gate`` and
``normalize``): the oracle against a plain double loop, every form against the oracle,
gradients against central differences, the float32 range of the chunked form, and bad
inputs."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import assert_gradients_match, peak_traced_bytes, random_qkv
from linattn import State, linear_attention, linear_attention_backward
from linattn.dispatch import numba_imports
from linattn.feature_maps import get_feature_map

METHODS = ("quadratic", "linear", "chunked", "recurrent")


def double_loop(q, k, v, g, normalize=True, eps=1e-6, s0=None, z0=None):
    """out_i = sum_{j <= i} (phi(q_i) * exp(sum_{l=j+1..i} g_l)) . phi(k_j) v_j, over
    (N, D) inputs one pair at a time, normalised likewise; the state (s0, z0) decays by all
    of g_1..g_i. The obvious formula the oracle is held to."""
    phi = get_feature_map("elu+1")
    pq, pk = phi.forward(q), phi.forward(k)
    n, f = pq.shape
    out = np.zeros((n, v.shape[-1]))
    for i in range(n):
        num, den = np.zeros(v.shape[-1]), 0.0
        for j in range(i + 1):
            w = float(np.sum(pq[i] * np.exp(g[j + 1:i + 1].sum(axis=0)) * pk[j]))
            num, den = num + w * v[j], den + w
        if s0 is not None:
            decayed = pq[i] * np.exp(g[:i + 1].sum(axis=0))
            num, den = num + decayed @ s0, den + decayed @ z0
        out[i] = num / (den + eps) if normalize else num
    return out


def gates(seed, lead, n, f):
    return -np.random.default_rng(seed + 1).uniform(0, 2, (*lead, n, f))


@pytest.mark.parametrize("normalize", [True, False])
def test_oracle_matches_double_loop(normalize):
    q, k, v = random_qkv(0, 6, 3, 2)
    g = gates(0, (), 6, 3)
    got = linear_attention(q, k, v, causal=True, method="quadratic", log_gate=g,
                           normalize=normalize)
    np.testing.assert_allclose(got, double_loop(q, k, v, g, normalize), rtol=1e-12)
    got = linear_attention(q, k, v, causal=True, method="quadratic", decay=0.7,
                           normalize=normalize)
    want = double_loop(q, k, v, np.full((6, 3), np.log(0.7)), normalize)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_oracle_with_state_matches_double_loop():
    q, k, v = random_qkv(1, 5, 2, 3)
    g = gates(1, (), 5, 2)
    rng = np.random.default_rng(2)
    s0, z0 = rng.uniform(0, 1, (2, 3)), rng.uniform(0, 1, 2)
    got = linear_attention(q, k, v, causal=True, method="quadratic", log_gate=g,
                           initial_state=State(s0, z0))
    np.testing.assert_allclose(got, double_loop(q, k, v, g, s0=s0, z0=z0), rtol=1e-12)


@settings(max_examples=20)
@given(n=st.integers(1, 19), d=st.integers(1, 4), m=st.integers(1, 4),
       lead=st.lists(st.integers(1, 2), max_size=2).map(tuple),
       chunk=st.integers(1, 7), kind=st.sampled_from(["decay", "gate", "both", "none"]),
       normalize=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_forms_match_oracle(n, d, m, lead, chunk, kind, normalize, seed):
    q, k, v = random_qkv(seed, n, d, m, lead)
    kw = dict(causal=True, normalize=normalize)
    if kind in ("decay", "both"):
        kw["decay"] = np.random.default_rng(seed).uniform(0.3, 1.0, lead[-1:])
    if kind in ("gate", "both"):
        kw["log_gate"] = gates(seed, lead, n, d)
    if kind == "none" and normalize:
        kw["decay"] = 0.9
    want = linear_attention(q, k, v, method="quadratic", **kw)
    for method in METHODS[1:]:               # NumPy's forms; Numba's: test_decay_numba
        got = linear_attention(q, k, v, method=method, chunk_size=chunk, backend="numpy",
                               **kw)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=method)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("normalize", [True, False])
def test_gradients_match_central_differences(method, normalize):
    q, k, v = random_qkv(3, 5, 3, 2, (2,))
    g = gates(3, (2,), 5, 3)
    decay = np.array([0.8, 0.6])
    kw = dict(causal=True, method=method, chunk_size=2, normalize=normalize,
              backend="numpy")
    assert_gradients_match(
        lambda q, k, v, g, decay: linear_attention(q, k, v, log_gate=g, decay=decay, **kw),
        lambda dout, q, k, v, g, decay: linear_attention_backward(
            dout, q, k, v, log_gate=g, decay=decay, **kw),
        [q, k, v, g, decay])


@pytest.mark.parametrize("method", ["quadratic", "chunked"])
def test_gradients_with_states_match_central_differences(method):
    q, k, v = random_qkv(4, 5, 2, 2)
    g = gates(4, (), 5, 2)
    rng = np.random.default_rng(5)
    s0, z0 = rng.uniform(0, 1, (2, 2)), rng.uniform(0, 1, 2)
    kw = dict(causal=True, method=method, chunk_size=2)
    out_size = 10                                # out (5, 2), then S (2, 2) and z (2,)

    def f(q, k, v, g, s0, z0):                   # the output and the final state, in one
        out, state = linear_attention(q, k, v, log_gate=g, initial_state=State(s0, z0),
                                      return_state=True, **kw)
        return np.concatenate([out.ravel(), state.S.ravel(), state.z.ravel()])

    def f_backward(dall, q, k, v, g, s0, z0):
        dout = dall[:out_size].reshape(5, 2)
        dstate = State(dall[out_size:out_size + 4].reshape(2, 2), dall[out_size + 4:])
        dq, dk, dv, dg, d0 = linear_attention_backward(
            dout, q, k, v, log_gate=g, initial_state=State(s0, z0), dstate=dstate, **kw)
        return dq, dk, dv, dg, d0.S, d0.z

    assert_gradients_match(f, f_backward, [q, k, v, g, s0, z0])


def test_pieces_with_states_equal_one_pass():
    q, k, v = random_qkv(6, 12, 3, 2, (2,))
    g = gates(6, (2,), 12, 3)
    kw = dict(causal=True, decay=np.array([0.9, 0.7]))
    whole = linear_attention(q, k, v, log_gate=g, **kw)
    first, state = linear_attention(q[:, :5], k[:, :5], v[:, :5], log_gate=g[:, :5],
                                    return_state=True, **kw)
    second = linear_attention(q[:, 5:], k[:, 5:], v[:, 5:], log_gate=g[:, 5:],
                              initial_state=state, method="linear", **kw)
    np.testing.assert_allclose(np.concatenate([first, second], axis=1), whole, rtol=1e-10)


def test_padded_keys_leave_the_state_as_it_was():
    q, k, v = random_qkv(7, 9, 2, 3)
    g = gates(7, (), 9, 2)
    alone = linear_attention(q[:6], k[:6], v[:6], causal=True, log_gate=g[:6])
    k_pad, v_pad, g_pad = k.copy(), v.copy(), g.copy()
    k_pad[6:], v_pad[6:], g_pad[6:] = np.nan, np.nan, -3.0
    for method in METHODS:
        got = linear_attention(q, k_pad, v_pad, causal=True, log_gate=g_pad, method=method,
                               key_lengths=np.array(6))
        np.testing.assert_allclose(got[:6], alone, rtol=1e-10, err_msg=method)
        grads = linear_attention_backward(np.ones_like(got), q, k_pad, v_pad, causal=True,
                                          log_gate=g_pad, method=method,
                                          key_lengths=np.array(6))
        assert np.all(grads[3][6:] == 0) and np.all(grads[1][6:] == 0)


@pytest.mark.parametrize("method", METHODS)
def test_no_decay_is_todays_path(method):
    q, k, v = random_qkv(8, 11, 3, 2, (2,))
    dout = np.random.default_rng(8).standard_normal(v.shape)
    plain = linear_attention(q, k, v, causal=True, method=method)
    np.testing.assert_array_equal(linear_attention(q, k, v, causal=True, method=method,
                                                   decay=None, log_gate=None), plain)
    np.testing.assert_allclose(linear_attention(q, k, v, causal=True, method=method,
                                                decay=1.0), plain, rtol=1e-12)
    want = linear_attention_backward(dout, q, k, v, causal=True, method=method)
    got = linear_attention_backward(dout, q, k, v, causal=True, method=method, decay=None)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    got = linear_attention_backward(dout, q, k, v, causal=True, method=method, decay=1.0)
    assert len(got) == 4 and got[3].shape == ()
    for g, w in zip(got[:3], want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


def test_unnormalised_without_decay_is_the_masked_product():
    q, k, v = random_qkv(9, 7, 3, 2)
    phi = get_feature_map("elu+1")
    want = np.tril(phi.forward(q) @ phi.forward(k).T) @ v
    for method in METHODS:
        got = linear_attention(q, k, v, causal=True, normalize=False, method=method)
        np.testing.assert_allclose(got, want, rtol=1e-10, err_msg=method)


def test_unnormalised_non_causal_is_the_plain_product():
    q, k, v = random_qkv(14, 6, 3, 2, (2,))
    phi = get_feature_map("elu+1")
    want = phi.forward(q) @ (phi.forward(k).swapaxes(-1, -2) @ v)
    for method in METHODS:
        got = linear_attention(q, k, v, normalize=False, method=method)
        np.testing.assert_allclose(got, want, rtol=1e-10, err_msg=method)
    kw = dict(normalize=False, method="chunked")
    assert_gradients_match(lambda q, k, v: linear_attention(q, k, v, **kw),
                           lambda dout, q, k, v: linear_attention_backward(dout, q, k, v,
                                                                           **kw),
                           [q, k, v])


@pytest.mark.parametrize("gate", ["decay", "log_gate"])
def test_float32_long_strong_decay_stays_finite(gate):
    n = 65536
    q, k, v = random_qkv(10, n, 2, 2, dtype=np.float32)
    kw = dict(decay=0.5) if gate == "decay" else dict(log_gate=np.full((n, 2), -5.0,
                                                                     np.float32))
    out = linear_attention(q, k, v, causal=True, method="chunked", **kw)
    assert out.dtype == np.float32 and np.all(np.isfinite(out))
    # old keys weigh less than 2^-60: the last positions are a short window's, in float64
    w = 128
    kw_w = kw if gate == "decay" else dict(log_gate=np.full((w, 2), -5.0))
    tail = linear_attention(*(x[-w:].astype(np.float64) for x in (q, k, v)), causal=True,
                            method="quadratic", **kw_w)
    np.testing.assert_allclose(out[-32:], tail[-32:], rtol=1e-4, atol=1e-5)
    grads = linear_attention_backward(np.ones_like(out), q, k, v, causal=True,
                                      method="chunked", **kw)
    assert all(np.all(np.isfinite(g)) for g in grads)


def test_nan_gate_gives_nan_not_an_error():
    q, k, v = random_qkv(11, 4, 2, 2)
    g = gates(11, (), 4, 2)
    g[2, 0] = np.nan
    out = linear_attention(q, k, v, causal=True, log_gate=g, method="linear")
    assert np.all(np.isfinite(out[:2])) and np.all(np.isnan(out[2:]))


@pytest.mark.parametrize("kw, words", [
    (dict(causal=False, decay=0.5), "causal=True"),
    (dict(causal=False, log_gate=np.zeros((2, 5, 3))), "causal=True"),
    (dict(causal=True, decay=0.0), "(0, 1]"),
    (dict(causal=True, decay=-0.5), "(0, 1]"),
    (dict(causal=True, decay=1.5), "(0, 1]"),
    (dict(causal=True, decay=np.full(3, 0.5)), "leading axes"),
    (dict(causal=True, log_gate=np.zeros((2, 5, 4))), "F = 3"),
    (dict(causal=True, log_gate=np.full((2, 5, 3), 0.1)), "<= 0"),
    (dict(causal=True, log_gate=np.full((2, 5, 3), -np.inf)), "finite"),
])
def test_bad_inputs_are_refused(kw, words):
    q, k, v = random_qkv(12, 5, 3, 2, (2,))
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[")):
        linear_attention(q, k, v, **kw)


@pytest.mark.skipif(not numba_imports(), reason="numba is not installed")
@pytest.mark.parametrize("method", ["quadratic", "chunked"])
def test_numba_backend_with_decay_is_refused(method):
    q, k, v = random_qkv(13, 5, 3, 2)
    with pytest.raises(ValueError, match=f"backend 'numba'.*'{method}'.*decay"):
        linear_attention(q, k, v, causal=True, decay=0.5, backend="numba", method=method)
    auto = linear_attention(q, k, v, causal=True, decay=0.5, method=method)
    np.testing.assert_array_equal(auto, linear_attention(q, k, v, causal=True, decay=0.5,
                                                         method=method, backend="numpy"))


@pytest.mark.parametrize("backend, method", [("numpy", "chunked"), ("numpy", "recurrent"),
                                             ("numba", "recurrent")])
@pytest.mark.parametrize("gate", ["decay", "log_gate"])
def test_gated_memory_grows_with_n_not_n_squared(backend, method, gate):
    # tracemalloc traces NumPy's arrays and Numba's (PyMem_RawMalloc): forward and backward
    # stay O(N (F + M)) plus one state per chunk, never N x N or one (F, M) state a position
    if backend == "numba" and not numba_imports():
        pytest.skip("numba is not installed")
    n, d = 4096, 32
    q, k, v = np.random.default_rng(0).standard_normal((3, n, d))
    gates = {"decay": 0.99, "log_gate": np.full((n, d), -0.01)}[gate]
    kw = dict(causal=True, method=method, backend=backend, **{gate: gates})
    linear_attention_backward(v[:8], q[:8], k[:8], v[:8], **{**kw, gate: (
        gates if gate == "decay" else gates[:8])})                  # compiled, outside
    inputs = 3 * n * d * 8                                           # q, k, v: 3 MiB
    n_by_n, state_per_position = n * n * 8, n * d * d * 8            # 128 MiB and 32 MiB
    forward = peak_traced_bytes(linear_attention, q, k, v, **kw)
    backward = peak_traced_bytes(linear_attention_backward, v, q, k, v, **kw)
    assert forward < 6 * inputs, forward                          # O(N (F + M))
    assert backward < 8 * inputs, backward
    assert 8 * inputs < min(n_by_n, state_per_position)            # the bounds tell them apart
    # the check can fail: the oracle builds the (N, N) decayed kernel matrix
    if method == "chunked":
        quadratic = peak_traced_bytes(linear_attention, q[:1024], k[:1024], v[:1024],
                          **{**kw, "method": "quadratic", gate: (
                              gates if gate == "decay" else gates[:1024])})
        assert quadratic > 1024 * 1024 * 8
