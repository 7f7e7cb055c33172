"""A bidirectional LSTM stack with hand-written backpropagation through time: the recurrent
baseline of the speech experiment, section 4.3 and Table 3 of Katharopoulos et al. (2020),
arXiv:2006.16236 (theirs: 3 layers of 320 units per direction; ours is smaller).

One LSTM step (Hochreiter and Schmidhuber, 1997, with a forget gate), gates in the order
i, f, g, o of the 4H columns:
    z_t = x_t W + h_{t-1} U + b                         (4H pre-activations)
    i, f, o = sigmoid(z_i), sigmoid(z_f), sigmoid(z_o),  g = tanh(z_g)
    c_t = f * c_{t-1} + i * g,    h_t = o * tanh(c_t),    h_0 = c_0 = 0.
The forward direction reads each utterance from its first frame; the backward direction
reads it from its own last frame (frame lengths[b] - 1, not T_max - 1): its input is the
utterance reversed within its length (``reverse_padded``), so both directions run as one
scan over a leading direction axis (2, B, T, ...) with per-direction weights. Padding sits
after the last real frame in both, so zeroing the outputs of padded frames is exact: they
reach no real frame forwards, and their zero gradient reaches none backwards.

A layer's output is [h_fwd, h_bwd] (B, T, 2H); the stack ends in a linear layer to C class
scores per frame. Parameters: one dict, ``lstm{l}.w`` (2, D_l, 4H), ``lstm{l}.u``
(2, H, 4H), ``lstm{l}.b`` (2, 4H) per layer, then ``w_out`` (2H, C), ``b_out`` (C,).
Reference: tests/test_model_lstm.py holds the backward to central finite differences and the
scan to a step-by-step loop over each utterance alone.
"""
from typing import NamedTuple

import numpy as np

from ..layers import linear, linear_backward


class ScanCache(NamedTuple):
    """One layer's activations, each (2, B, T, H): the gates i, f, g, o, the cell c and the
    hidden state h (before masking) at every step."""

    i: object
    f: object
    g: object
    o: object
    c: object
    h: object


class LSTMCache(NamedTuple):
    """The stack's intermediates: each layer's input (B, T, D_l) and ScanCache, and the last
    layer's output (B, T, 2H)."""

    inputs: tuple
    scans: tuple
    out: object


def init_params(n_inputs, hidden, n_layers, n_classes, seed=0, dtype="float32"):
    """Random parameters, deterministic in ``seed``: weights uniform in +-1/sqrt(H) (the
    usual LSTM scale), biases 0 except the forget gate's, 1 (remember by default).

    Returns
    -------
    params : dict of str -> ndarray, in ``dtype``.
    """
    rng = np.random.default_rng(seed)
    h = hidden
    params = {}
    for layer in range(n_layers):
        d = n_inputs if layer == 0 else 2 * h
        b = np.zeros((2, 4 * h))
        b[:, h:2 * h] = 1.0                                       # forget gate bias
        params[f"lstm{layer}.w"] = rng.uniform(-1, 1, (2, d, 4 * h)) / np.sqrt(h)
        params[f"lstm{layer}.u"] = rng.uniform(-1, 1, (2, h, 4 * h)) / np.sqrt(h)
        params[f"lstm{layer}.b"] = b
    params["w_out"] = rng.standard_normal((2 * h, n_classes)) / np.sqrt(2 * h)
    params["b_out"] = np.zeros(n_classes)
    return {name: a.astype(dtype) for name, a in params.items()}


def reverse_padded(x, lengths):
    """Reverse each sequence within its own length: out[b, t] = x[b, lengths[b] - 1 - t] for
    t < lengths[b], padded frames left in place. x (B, T, ...). Its own inverse, so also its
    own backward."""
    t = np.arange(x.shape[1])[None, :]
    lengths = np.asarray(lengths)[:, None]
    src = np.where(t < lengths, lengths - 1 - t, t)                # (B, T)
    return x[np.arange(x.shape[0])[:, None], src]


def _sigmoid(x):
    return 0.5 * (1 + np.tanh(0.5 * x))                            # overflow-free form


def scan(w, u, b, x, mask):
    """Both directions' LSTMs over their inputs, padded frames' outputs zeroed.

    Parameters
    ----------
    w : ndarray, shape (2, D, 4H)
    u : ndarray, shape (2, H, 4H)
    b : ndarray, shape (2, 4H)
    x : ndarray, shape (2, B, T, D)
        Direction 0's and direction 1's inputs (the latter already reversed).
    mask : ndarray, shape (B, T)
        1 on real frames, 0 on padding (which follows every real frame).

    Returns
    -------
    out : ndarray, shape (2, B, T, H), h_t * mask_t
    cache : ScanCache

    Cost: O(B T H (D + H)) time; a Python loop over T.
    """
    n_dir, n_b, n_t, _ = x.shape
    hidden = u.shape[1]
    # x_t W + b for every step at once, (2, B*T, 4H) -> (2, B, T, 4H)
    xw = (x.reshape(n_dir, n_b * n_t, -1) @ w).reshape(n_dir, n_b, n_t, -1) + b[:, None, None]
    acts = {k: np.empty((n_dir, n_b, n_t, hidden), dtype=x.dtype) for k in "ifgoch"}
    h = np.zeros((n_dir, n_b, hidden), dtype=x.dtype)
    c = np.zeros_like(h)
    for t in range(n_t):
        z = xw[:, :, t] + h @ u                                    # (2, B, 4H)
        i, f, o = (_sigmoid(z[..., k * hidden:(k + 1) * hidden]) for k in (0, 1, 3))
        g = np.tanh(z[..., 2 * hidden:3 * hidden])
        c = f * c + i * g                                          # c_t = f c_{t-1} + i g
        h = o * np.tanh(c)                                         # h_t = o tanh(c_t)
        for k, a in zip("ifgoch", (i, f, g, o, c, h)):
            acts[k][:, :, t] = a
    cache = ScanCache(**{k: acts[k] for k in "ifgoch"})
    return cache.h * mask[None, :, :, None], cache


def scan_backward(dout, w, u, b, x, mask, cache):
    """Backward of ``scan``, through time: (dw, du, db, dx) shaped like (w, u, b, x).

    Going back from t = T - 1, with dh, dc the gradients reaching h_t, c_t:
        dh = dout_t mask_t + (dz_{t+1} U^T),   dc = dh o (1 - tanh(c_t)^2) + dc_{t+1} f_{t+1},
        di = dc g, df = dc c_{t-1}, dg = dc i, do = dh tanh(c_t),
    through the gate nonlinearities: dz = (di i(1-i), df f(1-f), dg (1-g^2), do o(1-o)).
    Then dW = sum_t x_t^T dz_t, dU = sum_t h_{t-1}^T dz_t, db = sum_t dz_t, dx_t = dz_t W^T.
    """
    n_dir, n_b, n_t, _ = x.shape
    hidden = u.shape[1]
    dz = np.empty((n_dir, n_b, n_t, 4 * hidden), dtype=x.dtype)
    dh_next = np.zeros((n_dir, n_b, hidden), dtype=x.dtype)        # dz_{t+1} U^T
    dc_next = np.zeros_like(dh_next)                               # dc_{t+1} f_{t+1}
    u_t = u.transpose(0, 2, 1)
    for t in range(n_t - 1, -1, -1):
        i, f, g, o, c = (a[:, :, t] for a in cache[:5])
        c_prev = cache.c[:, :, t - 1] if t > 0 else np.zeros_like(c)
        tanh_c = np.tanh(c)
        dh = dout[:, :, t] * mask[None, :, t, None] + dh_next
        dc = dh * o * (1 - tanh_c * tanh_c) + dc_next
        dz[:, :, t, :hidden] = dc * g * i * (1 - i)                # di through sigmoid
        dz[:, :, t, hidden:2 * hidden] = dc * c_prev * f * (1 - f)  # df
        dz[:, :, t, 2 * hidden:3 * hidden] = dc * i * (1 - g * g)  # dg through tanh
        dz[:, :, t, 3 * hidden:] = dh * tanh_c * o * (1 - o)       # do
        dc_next = dc * f
        dh_next = dz[:, :, t] @ u_t                                # (2, B, H)
    h_prev = np.zeros_like(cache.h)                                # h_{t-1}, h_0 = 0
    h_prev[:, :, 1:] = cache.h[:, :, :-1]
    rows = n_b * n_t
    dz2 = dz.reshape(n_dir, rows, 4 * hidden)
    dw = x.reshape(n_dir, rows, -1).transpose(0, 2, 1) @ dz2       # (2, D, 4H)
    du = h_prev.reshape(n_dir, rows, hidden).transpose(0, 2, 1) @ dz2  # (2, H, 4H)
    dx = (dz2 @ w.transpose(0, 2, 1)).reshape(x.shape)             # (2, B, T, D)
    return dw, du, dz2.sum(axis=1), dx


def bilstm_layer(w, u, b, x, lengths):
    """One bidirectional layer: x (B, T, D) -> [h_fwd, h_bwd] (B, T, 2H), zero on padding.
    Returns (out, ScanCache)."""
    mask = (np.arange(x.shape[1])[None, :] < np.asarray(lengths)[:, None]).astype(x.dtype)
    both = np.stack([x, reverse_padded(x, lengths)])               # (2, B, T, D)
    h, cache = scan(w, u, b, both, mask)
    return np.concatenate([h[0], reverse_padded(h[1], lengths)], axis=-1), cache


def bilstm_layer_backward(dout, w, u, b, x, lengths, cache):
    """Backward of ``bilstm_layer``: (dw, du, db, dx)."""
    hidden = u.shape[1]
    mask = (np.arange(x.shape[1])[None, :] < np.asarray(lengths)[:, None]).astype(x.dtype)
    both = np.stack([x, reverse_padded(x, lengths)])
    dh = np.stack([dout[..., :hidden], reverse_padded(dout[..., hidden:], lengths)])
    dw, du, db, dboth = scan_backward(dh, w, u, b, both, mask, cache)
    return dw, du, db, dboth[0] + reverse_padded(dboth[1], lengths)


def forward(params, x, lengths):
    """Per-frame class scores of the stack.

    Parameters
    ----------
    params : dict from ``init_params``
    x : ndarray, shape (B, T, n_inputs)
    lengths : ndarray of int, shape (B,)
        Real frames per utterance; later frames are padding and do not affect real ones.

    Returns
    -------
    logits : ndarray, shape (B, T, C)
    cache : LSTMCache

    Cost: O(L B T H (D + H) + B T H C); a Python loop over T per layer.
    """
    inputs, scans = [], []
    n_layers = sum(name.endswith(".w") for name in params)
    for layer in range(n_layers):
        inputs.append(x)
        x, cache = bilstm_layer(*(params[f"lstm{layer}.{n}"] for n in "wub"), x, lengths)
        scans.append(cache)
    logits = linear(x, params["w_out"], params["b_out"])
    return logits, LSTMCache(tuple(inputs), tuple(scans), x)


def backward(dlogits, params, lengths, cache):
    """Backward of ``forward``: (dx, grads) with dx (B, T, n_inputs) and grads a dict shaped
    like params."""
    grads = {}
    dx, grads["w_out"], grads["b_out"] = linear_backward(dlogits, cache.out, params["w_out"],
                                                         params["b_out"])
    for layer in reversed(range(len(cache.scans))):
        wub = (params[f"lstm{layer}.{n}"] for n in "wub")
        *g, dx = bilstm_layer_backward(dx, *wub, cache.inputs[layer], lengths,
                                       cache.scans[layer])
        grads.update({f"lstm{layer}.{n}": a for n, a in zip("wub", g)})
    return dx, grads
