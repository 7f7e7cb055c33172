"""The transformer's small layers, each forward with its backward directly below it.

Linear, layer norm, GELU, ReLU, embedding lookup and softmax cross-entropy: the pieces
around the attention of Katharopoulos et al. (2020), arXiv:2006.16236, section 3.1 (the
f_l(.) of Eq. (1) is an MLP, and the transformer a stack of such layers).

Every function is pure. A backward takes the upstream gradient plus the forward's inputs,
recomputes what it needs, and returns one gradient per float array input. Each one is held
to central finite differences in tests/test_model_layers.py; there is no faster path here,
so these are their own reference.
"""
import numpy as np

# the constants of the layers, named once: the compiled layers of ``model.fast`` read these
LAYER_NORM_EPS = 1e-5           # added to the variance before its square root
GELU_C = np.sqrt(2 / np.pi)     # GELU's tanh form: tanh(GELU_C (x + GELU_CUBIC x^3))
GELU_CUBIC = 0.044715


def linear(x, w, b):
    """y = x W + b.

    Parameters
    ----------
    x : ndarray, shape (..., D_in)
    w : ndarray, shape (D_in, D_out)
    b : ndarray, shape (D_out,)

    Returns
    -------
    y : ndarray, shape (..., D_out)

    Cost: O(size(x) D_out) time. The leading axes are flattened into one matrix product:
    NumPy's stacked (3-D @ 2-D) matmul can be many times slower than one BLAS call.
    """
    return (_rows(x) @ w).reshape(*x.shape[:-1], w.shape[1]) + b


def linear_backward(dy, x, w, b):
    """Gradients of ``linear``: dx = dy W^T, dW = x^T dy (summed over leading axes),
    db = sum of dy over leading axes. Returns (dx, dw, db) shaped like (x, w, b)."""
    x2, dy2 = _rows(x), _rows(dy)                     # (rows, D_in), (rows, D_out)
    return (dy2 @ w.T).reshape(x.shape), x2.T @ dy2, dy2.sum(axis=0)


def _rows(x):
    """(..., D) -> (rows, D), one row per position."""
    return x.reshape(-1, x.shape[-1])


def _normalise(x, eps):
    """xhat = (x - mean) / sqrt(var + eps) over the last axis, and 1 / sqrt(var + eps)."""
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    rstd = 1 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)  # (..., 1)
    return xc * rstd, rstd


def layer_norm(x, g, b, eps=LAYER_NORM_EPS):
    """Layer normalisation over the last axis: y = g * (x - mean) / sqrt(var + eps) + b.

    Parameters
    ----------
    x : ndarray, shape (..., D)
    g, b : ndarray, shape (D,)
        Gain and bias.

    Returns
    -------
    y : ndarray, shape (..., D)

    Cost: O(size(x)).
    """
    xhat, _ = _normalise(x, eps)
    return xhat * g + b


def layer_norm_backward(dy, x, g, b, eps=LAYER_NORM_EPS):
    """Gradients of ``layer_norm``: (dx, dg, db).

    With dxhat = dy * g, the centring and the scaling give
    dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) over the last axis.
    """
    xhat, rstd = _normalise(x, eps)
    dxhat = dy * g
    dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    lead = tuple(range(x.ndim - 1))
    return dx, (dy * xhat).sum(axis=lead), dy.sum(axis=lead)


def _gelu_tanh(x):
    """t = tanh(c (x + GELU_CUBIC x^3)) and c = GELU_C, both in x's type."""
    c = x.dtype.type(GELU_C)
    return np.tanh(c * (x + GELU_CUBIC * x * x * x)), c


def gelu(x):
    """GELU, tanh form: x s with the gate s = 0.5 (1 + tanh(c (x + 0.044715 x^3))),
    c = sqrt(2 / pi) (``GELU_C``, ``GELU_CUBIC``).

    Elementwise, any shape. Cost: O(size(x)).
    """
    t, _ = _gelu_tanh(x)
    return 0.5 * x * (1 + t)


def gelu_backward(dy, x):
    """Gradient of ``gelu``: dy * (0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 * 0.044715 x^2))
    with t = tanh(c (x + 0.044715 x^3)). Returns (dx,)."""
    t, c = _gelu_tanh(x)
    dgelu = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * GELU_CUBIC * x * x)
    return (dy * dgelu,)


def relu(x):
    """max(x, 0), elementwise (NaN stays NaN). Cost: O(size(x))."""
    return np.maximum(x, 0)


def relu_backward(dy, x):
    """Gradient of ``relu``: dy where x > 0, else 0. Returns (dx,)."""
    return (np.where(x > 0, dy, 0).astype(dy.dtype, copy=False),)


ACTIVATIONS = {"gelu": (gelu, gelu_backward), "relu": (relu, relu_backward)}


def sigmoid(x):
    """1 / (1 + exp(-x)), elementwise, computed from exp(-|x|) so it cannot overflow.
    Cost: O(size(x))."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def sigmoid_backward(dy, x):
    """Gradient of ``sigmoid``: dy * s (1 - s), s = sigmoid(x). Returns (dx,)."""
    s = sigmoid(x)
    return (dy * s * (1 - s),)


def log_sigmoid(x):
    """log sigmoid(x) = min(x, 0) - log(1 + exp(-|x|)), elementwise, <= 0 and finite for
    every finite x. Cost: O(size(x))."""
    return np.minimum(x, 0) - np.log1p(np.exp(-np.abs(x)))


def log_sigmoid_backward(dy, x):
    """Gradient of ``log_sigmoid``: d/dx log sigmoid(x) = 1 - sigmoid(x) = sigmoid(-x), so
    dx = dy * sigmoid(-x). Returns (dx,)."""
    return (dy * sigmoid(-x),)


def embedding(ids, table):
    """Row lookup: out[..., :] = table[ids[...], :].

    Parameters
    ----------
    ids : ndarray of int, shape (...)
    table : ndarray, shape (V, D)

    Returns
    -------
    out : ndarray, shape (..., D)
    """
    return table[ids]


def embedding_backward(dout, ids, table):
    """Gradient of ``embedding`` with respect to the table: each row of dout is added to
    the row it was read from (repeated ids accumulate). Returns (dtable,)."""
    dtable = np.zeros_like(table)
    np.add.at(dtable, ids.reshape(-1), dout.reshape(-1, table.shape[-1]))
    return (dtable,)


def _log_softmax(logits):
    """log softmax over the last axis, shifted by the row maximum so exp() cannot overflow."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def cross_entropy(logits, targets, weights=None):
    """Weighted mean softmax cross-entropy, in nats per counted token.

    loss = sum_t w_t (-log softmax(logits_t)[targets_t]) / sum_t w_t.

    Parameters
    ----------
    logits : ndarray, shape (..., V)
    targets : ndarray of int, shape (...)
    weights : ndarray, shape (...), optional
        Per-token weights, e.g. a 0/1 mask of the positions that count; all ones if None.

    Returns
    -------
    loss : float

    Cost: O(size(logits)).
    """
    w = np.ones(targets.shape) if weights is None else weights
    logp = np.take_along_axis(_log_softmax(logits), targets[..., None], axis=-1)[..., 0]
    return float(-(w * logp).sum() / w.sum())


def cross_entropy_backward(dloss, logits, targets, weights=None):
    """Gradient of ``cross_entropy`` with respect to the logits:
    dlogits_t = dloss * w_t (softmax(logits_t) - onehot(targets_t)) / sum_t w_t.
    Returns (dlogits,), shaped and typed like logits."""
    w = np.ones(targets.shape) if weights is None else weights
    p = np.exp(_log_softmax(logits))
    np.put_along_axis(p, targets[..., None],
                      np.take_along_axis(p, targets[..., None], axis=-1) - 1, axis=-1)
    scale = (dloss * w / w.sum())[..., None]
    return ((p * scale).astype(logits.dtype, copy=False),)
