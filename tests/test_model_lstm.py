"""The bidirectional LSTM: its scan against a plain step-by-step loop over each utterance
alone (so the backward direction starts at the utterance's own last frame), padding that
reaches no real frame, and every gradient against central finite differences (float64)."""
import numpy as np
import pytest

from helpers import assert_gradients_match, relative_error
from linattn.model.speech.lstm import (backward, bilstm_layer, bilstm_layer_backward, forward,
                                init_params, reverse_padded)

LENGTHS = np.array([6, 3, 5])


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _plain_lstm(w, u, b, x):
    """h_1..h_n of one direction over x (n, D), one step at a time, as written in a book."""
    hidden = u.shape[0]
    h, c, out = np.zeros(hidden), np.zeros(hidden), []
    for x_t in x:
        z = x_t @ w + h @ u + b
        i, f = _sigmoid(z[:hidden]), _sigmoid(z[hidden:2 * hidden])
        g, o = np.tanh(z[2 * hidden:3 * hidden]), _sigmoid(z[3 * hidden:])
        c = f * c + i * g
        h = o * np.tanh(c)
        out.append(h)
    return np.array(out)


def _layer_params(seed, d=4, hidden=3):
    p = init_params(d, hidden, 1, 2, seed=seed, dtype="float64")
    rng = np.random.default_rng(seed + 1)
    p["lstm0.b"] = p["lstm0.b"] + 0.3 * rng.standard_normal(p["lstm0.b"].shape)
    return p["lstm0.w"], p["lstm0.u"], p["lstm0.b"]


def test_reverse_padded_reverses_within_each_length():
    x = np.arange(12).reshape(2, 6)
    out = reverse_padded(x, [4, 6])
    np.testing.assert_array_equal(out, [[3, 2, 1, 0, 4, 5], [11, 10, 9, 8, 7, 6]])
    np.testing.assert_array_equal(reverse_padded(out, [4, 6]), x)   # its own inverse


def test_layer_matches_each_utterance_alone():
    w, u, b = _layer_params(0)
    x = np.random.default_rng(2).standard_normal((3, 6, 4))
    out, _ = bilstm_layer(w, u, b, x, LENGTHS)
    for k, n in enumerate(LENGTHS):
        fwd = _plain_lstm(w[0], u[0], b[0], x[k, :n])
        bwd = _plain_lstm(w[1], u[1], b[1], x[k, :n][::-1])[::-1]   # from frame n - 1
        np.testing.assert_allclose(out[k, :n], np.concatenate([fwd, bwd], axis=1),
                                   rtol=1e-12, atol=1e-14)
        assert np.all(out[k, n:] == 0)


def test_padding_reaches_no_real_frame():
    params = init_params(4, 3, 2, 5, seed=3, dtype="float64")
    x = np.random.default_rng(4).standard_normal((3, 6, 4))
    logits, cache = forward(params, x, LENGTHS)
    noisy = x.copy()
    for k, n in enumerate(LENGTHS):
        noisy[k, n:] = 1e3
    logits2, _ = forward(params, noisy, LENGTHS)
    real = np.arange(6)[None, :] < LENGTHS[:, None]
    np.testing.assert_array_equal(logits2[real], logits[real])
    dlogits = np.where(real[..., None], np.random.default_rng(5).standard_normal(logits.shape),
                       0.0)
    dx, _ = backward(dlogits, params, LENGTHS, cache)
    assert np.all(dx[~real] == 0)


def test_layer_gradient():
    w, u, b = _layer_params(6)
    x = np.random.default_rng(7).standard_normal((3, 6, 4))

    def f(x, w, u, b):
        return bilstm_layer(w, u, b, x, LENGTHS)[0]

    def f_backward(dout, x, w, u, b):
        dw, du, db, dx = bilstm_layer_backward(dout, w, u, b, x, LENGTHS,
                                               bilstm_layer(w, u, b, x, LENGTHS)[1])
        return dx, dw, du, db

    assert_gradients_match(f, f_backward, [x, w, u, b])


@pytest.mark.parametrize("n_layers", [1, 2])
def test_stack_gradient(n_layers):
    params = init_params(3, 2, n_layers, 4, seed=8, dtype="float64")
    x = np.random.default_rng(9).standard_normal((3, 6, 3))
    names = sorted(params)

    def f(x, *arrays):
        return forward(dict(zip(names, arrays)), x, LENGTHS)[0]

    def f_backward(dlogits, x, *arrays):
        p = dict(zip(names, arrays))
        dx, grads = backward(dlogits, p, LENGTHS, forward(p, x, LENGTHS)[1])
        assert grads.keys() == p.keys()
        return (dx, *(grads[n] for n in names))

    assert_gradients_match(f, f_backward, [x, *(params[n] for n in names)])


def test_init_shapes_and_float32():
    params = init_params(40, 8, 2, 41)
    assert params["lstm0.w"].shape == (2, 40, 32) and params["lstm1.w"].shape == (2, 16, 32)
    assert params["lstm1.u"].shape == (2, 8, 32) and params["w_out"].shape == (16, 41)
    assert all(a.dtype == np.float32 for a in params.values())
    x = np.random.default_rng(0).standard_normal((2, 5, 40)).astype(np.float32)
    logits, cache = forward(params, x, [5, 2])
    dx, grads = backward(np.ones_like(logits), params, [5, 2], cache)
    assert logits.dtype == dx.dtype == np.float32
    assert all(grads[n].dtype == np.float32 for n in grads)
    assert relative_error(dx[1, 2:], np.zeros_like(dx[1, 2:])) == 0
