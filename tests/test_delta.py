"""The delta rule: the recurrent scan against a plain double loop, the chunked WY form against
the scan, forward and backward; gradients against finite differences; states handed over;
the overwrite property; memory; bad input."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from linattn import delta_rule_attention, delta_rule_attention_backward, delta_rule_step
from linattn import dispatch
from linattn.feature_maps import EluPlusOne

from helpers import numerical_parameter_gradients, peak_traced_bytes, random_qkv, relative_error

leads = st.sampled_from([(), (2,), (2, 3)])
seeds = st.integers(0, 2**32 - 1)
MAPS = ("elu+1", None)
BACKENDS = ("numpy", pytest.param("numba", marks=pytest.mark.skipif(
    not dispatch.numba_imports(), reason="numba is not installed")))


def random_inputs(seed, n, d, m, lead=()):
    q, k, v = random_qkv(seed, n, d, m, lead)
    beta = np.random.default_rng(seed + 1).uniform(0.05, 1.0, (*lead, n))
    return q, k, v, beta


def double_loop(q, k, v, beta, phi, S0=None):
    """The delta rule for 2-D inputs one entry at a time: S[f, m] += beta k[f] (v[m] - sum_g
    S[g, m] k[g]); out[m] = sum_f S[f, m] q[f], with unit phi(q), phi(k)."""
    n, m = v.shape
    feat = [[float(x) for x in (row if phi is None else phi.forward(row))] for row in q]
    keys = [[float(x) for x in (row if phi is None else phi.forward(row))] for row in k]
    f = len(keys[0])
    S = [[0.0] * m for _ in range(f)] if S0 is None else [list(r) for r in S0]
    out = np.zeros((n, m))
    for t in range(n):
        kn = sum(x * x for x in keys[t]) ** 0.5
        qn = sum(x * x for x in feat[t]) ** 0.5
        kt = [x / kn for x in keys[t]]
        qt = [x / qn for x in feat[t]]
        u = [v[t, j] - sum(S[g][j] * kt[g] for g in range(f)) for j in range(m)]
        for g in range(f):
            for j in range(m):
                S[g][j] += beta[t] * kt[g] * u[j]
        for j in range(m):
            out[t, j] = sum(S[g][j] * qt[g] for g in range(f))
    return out, np.array(S)


@given(n=st.integers(1, 6), d=st.integers(1, 3), m=st.integers(1, 3),
       fmap=st.sampled_from(MAPS), start=st.booleans(), seed=seeds)
@settings(max_examples=25)
def test_recurrent_is_the_double_loop(n, d, m, fmap, start, seed):
    q, k, v, beta = random_inputs(seed, n, d, m)
    S0 = np.random.default_rng(seed + 2).standard_normal((d, m)) if start else None
    phi = None if fmap is None else EluPlusOne()
    want, want_S = double_loop(q, k, v, beta, phi, S0)
    got, S = delta_rule_attention(q, k, v, beta, feature_map=fmap, method="recurrent",
                                  initial_state=S0, return_state=True)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(S, want_S, rtol=1e-10, atol=1e-12)


@given(n=st.integers(1, 33), d=st.integers(1, 6), m=st.integers(1, 6), lead=leads,
       chunk=st.integers(1, 9), fmap=st.sampled_from(MAPS), start=st.booleans(), seed=seeds)
@settings(max_examples=30)
def test_chunked_matches_recurrent(n, d, m, lead, chunk, fmap, start, seed):
    q, k, v, beta = random_inputs(seed, n, d, m, lead)
    rng = np.random.default_rng(seed + 2)
    S0 = rng.standard_normal((*lead, d, m)) if start else None
    kw = dict(feature_map=fmap, initial_state=S0, return_state=True, backend="numpy")
    want, want_S = delta_rule_attention(q, k, v, beta, method="recurrent", **kw)
    got, S = delta_rule_attention(q, k, v, beta, method="chunked", chunk_size=chunk, **kw)
    assert got.shape == (*lead, n, m) and S.shape == (*lead, d, m)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(S, want_S, rtol=1e-10, atol=1e-12)
    # and backward, with a gradient of the final state
    dout, dS = rng.standard_normal(v.shape), rng.standard_normal((*lead, d, m))
    kw = dict(feature_map=fmap, initial_state=S0, dstate=dS, backend="numpy")
    want = delta_rule_attention_backward(dout, q, k, v, beta, method="recurrent",
                                         chunk_size=max(1, chunk // 2), **kw)
    got = delta_rule_attention_backward(dout, q, k, v, beta, method="chunked",
                                        chunk_size=chunk, **kw)
    assert len(got) == len(want) == (5 if start else 4)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-11)


def test_auto_is_chunked():
    q, k, v, beta = random_inputs(3, 10, 3, 2)
    np.testing.assert_array_equal(delta_rule_attention(q, k, v, beta),
                                  delta_rule_attention(q, k, v, beta, method="chunked"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["recurrent", "chunked"])
@pytest.mark.parametrize("fmap", MAPS + ("taylor",))
@pytest.mark.parametrize("unit", [True, False])
def test_backward_matches_finite_differences(backend, method, fmap, unit):
    q, k, v, beta = random_inputs(5, 7, 3, 2, (2,))
    if not unit:
        q, k = 0.5 * q, 0.5 * k                     # keep beta ||phi(k)||^2 moderate
    f = 1 + 3 + 9 if fmap == "taylor" else 3
    rng = np.random.default_rng(9)
    S0, dout, dS = (rng.standard_normal(s) for s in ((2, f, 2), v.shape, (2, f, 2)))
    kw = dict(method=method, backend=backend, feature_map=fmap, chunk_size=3,
              normalize_keys=unit, normalize_queries=unit)

    def loss():
        out, S = delta_rule_attention(q, k, v, beta, initial_state=S0, return_state=True,
                                      **kw)
        return np.sum(out * dout) + np.sum(S * dS)

    want = numerical_parameter_gradients(dict(dq=q, dk=k, dv=v, dbeta=beta, dS0=S0), loss)
    got = delta_rule_attention_backward(dout, q, k, v, beta, initial_state=S0, dstate=dS,
                                        **kw)
    for (name, w), g in zip(want.items(), got, strict=True):
        assert g.shape == w.shape, name
        assert relative_error(g, w) < 1e-6, (name, relative_error(g, w))


@given(n=st.integers(1, 12), d=st.integers(1, 4), m=st.integers(1, 4), lead=leads,
       fmap=st.sampled_from(MAPS), seed=seeds)
@settings(max_examples=20)
def test_scanning_the_step_reproduces_the_forms(n, d, m, lead, fmap, seed):
    q, k, v, beta = random_inputs(seed, n, d, m, lead)
    S, outs = None, []
    for i in range(n):
        out_t, S = delta_rule_step(q[..., i, :], k[..., i, :], v[..., i, :], beta[..., i], S,
                                   feature_map=fmap)
        outs.append(out_t)
    for method in ("recurrent", "chunked"):
        want, want_S = delta_rule_attention(q, k, v, beta, feature_map=fmap, method=method,
                                            chunk_size=4, return_state=True)
        np.testing.assert_allclose(np.stack(outs, axis=-2), want, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(S, want_S, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", ["recurrent", "chunked"])
@given(n=st.integers(2, 20), cut=st.floats(0, 1), seed=seeds)
@settings(max_examples=15)
def test_two_pieces_equal_one_pass(method, n, cut, seed):
    q, k, v, beta = random_inputs(seed, n, 3, 2, (2,))
    a = int(cut * n)
    kw = dict(method=method, chunk_size=3)
    whole, S = delta_rule_attention(q, k, v, beta, return_state=True, **kw)
    first, S1 = delta_rule_attention(q[..., :a, :], k[..., :a, :], v[..., :a, :],
                                     beta[..., :a], return_state=True, **kw)
    second, S2 = delta_rule_attention(q[..., a:, :], k[..., a:, :], v[..., a:, :],
                                      beta[..., a:], initial_state=S1, return_state=True, **kw)
    np.testing.assert_allclose(np.concatenate([first, second], axis=-2), whole, rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(S2, S, rtol=1e-10, atol=1e-12)
    # backward: the second piece first, handing dS1 to the first as dstate
    rng = np.random.default_rng(seed + 3)
    dout, dS = rng.standard_normal(v.shape), rng.standard_normal(S.shape)
    want = delta_rule_attention_backward(dout, q, k, v, beta, initial_state=np.zeros_like(S),
                                         dstate=dS, **kw)
    late = delta_rule_attention_backward(dout[..., a:, :], q[..., a:, :], k[..., a:, :],
                                         v[..., a:, :], beta[..., a:], initial_state=S1,
                                         dstate=dS, **kw)
    early = delta_rule_attention_backward(dout[..., :a, :], q[..., :a, :], k[..., :a, :],
                                          v[..., :a, :], beta[..., :a],
                                          initial_state=np.zeros_like(S), dstate=late[4], **kw)
    for i in range(4):
        np.testing.assert_allclose(np.concatenate([early[i], late[i]], axis=-1 if i == 3
                                                  else -2), want[i], rtol=1e-10, atol=1e-11)
    np.testing.assert_allclose(early[4], want[4], rtol=1e-10, atol=1e-11)


def test_a_key_written_twice_holds_the_last_value():
    """beta = 1 and a unit key: the second write replaces the first, S^T k = v2; linear
    attention's memory adds them, S^T k = v1 + v2."""
    rng = np.random.default_rng(0)
    key = rng.standard_normal(4)
    key /= np.linalg.norm(key)
    v1, v2 = rng.standard_normal((2, 3))
    k = np.stack([key, key])
    out, S = delta_rule_attention(k, k, np.stack([v1, v2]), np.ones(2), feature_map=None,
                                  method="recurrent", return_state=True)
    np.testing.assert_allclose(S.T @ key, v2, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out[1], v2, rtol=1e-12, atol=1e-14)    # q = k reads it back
    np.testing.assert_allclose(out[0], v1, rtol=1e-12, atol=1e-14)
    additive = np.outer(key, v1) + np.outer(key, v2)    # linear attention, Eq. (18)
    np.testing.assert_allclose(additive.T @ key, v1 + v2, rtol=1e-12, atol=1e-14)
    assert np.max(np.abs(S.T @ key - (v1 + v2))) > 0.1 * np.max(np.abs(v1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_beta_gives_nan_and_float16_runs_in_float32(backend):
    q, k, v, beta = random_inputs(1, 6, 3, 2)
    beta[2] = np.nan                     # from position 2 on; in chunks, from its chunk on
    for method, chunk_size in (("recurrent", None), ("chunked", 2)):
        out = delta_rule_attention(q, k, v, beta, method=method, chunk_size=chunk_size,
                                   backend=backend)
        assert np.all(np.isfinite(out[:2])) and np.all(np.isnan(out[2:]))
    q, k, v, beta = (x.astype(np.float16) for x in random_inputs(1, 6, 3, 2))
    out = delta_rule_attention(q, k, v, beta, backend=backend)
    want = delta_rule_attention(*(x.astype(np.float32) for x in (q, k, v, beta)),
                                backend=backend)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out, want.astype(np.float16), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_memory_stays_far_below_one_state_per_position(backend):
    # tracemalloc sees every array NumPy allocates, and those Numba's compiled code allocates
    # (its runtime takes memory through PyMem_RawMalloc, which tracemalloc traces): the forms
    # make no N x N array and no memory per position, only per chunk (C x C, and backward
    # the (F, M) entering each). One row: Numba's threads each hold one row's buffers.
    n, d, m = 2048, 64, 64
    q, k, v, beta = random_inputs(4, n, d, m)
    dout = np.ones_like(v)
    kw = dict(method="chunked", backend=backend)
    delta_rule_attention_backward(dout[:5], q[:5], k[:5], v[:5], beta[:5], **kw)  # compiled
    one_state_per_position = n * d * m * 8                       # 64 MiB
    forward = peak_traced_bytes(delta_rule_attention, q, k, v, beta, chunk_size=32, **kw)
    assert forward < one_state_per_position / 4, forward
    backward = peak_traced_bytes(delta_rule_attention_backward, dout, q, k, v, beta,
                                 chunk_size=32, **kw)
    assert backward < one_state_per_position / 2, backward
    # the check can fail: a chunk of 1 stores the memory entering every position
    assert peak_traced_bytes(delta_rule_attention_backward, dout[:512], q[:512], k[:512], v[:512],
                 beta[:512], chunk_size=1, **kw) > 512 * d * m * 8


@pytest.mark.parametrize("call, match", [
    (dict(beta=np.ones(5)), r"beta must have shape \(6,\)"),
    (dict(beta=np.full(6, 2.5)), r"beta must lie in \[0, 2\]"),
    (dict(beta=-np.ones(6)), r"beta must lie in \[0, 2\]"),
    (dict(q=np.ones(3)), r"q, k, v need shape"),
    (dict(method="quadratic"), r"unknown method 'quadratic'"),
    (dict(backend="cupy", method="chunked"), r"no cupy kernel \(method 'chunked'\)"),
    (dict(initial_state=np.zeros((3, 3))), r"initial_state must have shape \(3, 2\)"),
    (dict(k=np.ones((5, 3))), r"same length Nk|one length N"),
])
def test_bad_input_is_a_clear_error(call, match):
    q, k, v, beta = random_inputs(2, 6, 3, 2)
    args = dict(q=q, k=k, v=v, beta=beta) | call
    with pytest.raises(ValueError, match=match):
        delta_rule_attention(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("beta"),
                             **args)


def test_bad_state_and_step_input():
    q, k, v, beta = random_inputs(2, 6, 3, 2)
    with pytest.raises(TypeError, match="not a tuple"):
        delta_rule_attention(q, k, v, beta, initial_state=(np.zeros((3, 2)), np.zeros(3)))
    with pytest.raises(ValueError, match=r"beta_t must have shape \(\)"):
        delta_rule_step(q[0], k[0], v[0], beta[:2])
    with pytest.raises(ValueError, match=r"no cupy kernel \(method 'recurrent'\)"):
        delta_rule_step(q[0], k[0], v[0], beta[0], backend="cupy")
    with pytest.raises(ValueError, match=r"dstate must have shape"):
        delta_rule_attention_backward(v, q, k, v, beta, dstate=np.zeros((2, 3)))
