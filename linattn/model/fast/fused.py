"""The transformer's element work for training as compiled loops: GELU with its bias, layer
norm with its residual add, their backward passes, the attention's heads split from the
projections and joined back, and the embedding's backward, each one pass over its arrays
with no full-size temporaries.

These are the lean training path's versions of ``layers.gelu``, ``layers.layer_norm`` and
``layers.embedding_backward`` (the pieces around the attention of Katharopoulos et al.
(2020), arXiv:2006.16236, section 3.1), which stay the references they are tested against
(tests/test_model_fused.py). They are no attention kernel of the dispatch table: only the
model's compiled path calls them, so they live here, Numba-only by design.

Two changes of form, not of function:
- GELU's gate s = 0.5 (1 + tanh(y)), y = c (x + 0.044715 x^3) (``layers.GELU_C`` and
  ``layers.GELU_CUBIC``), is computed as the logistic sigmoid 1 / (1 + exp(-2 y)), the same
  number without tanh, from exp(-2 |y|) <= 1: the library's vectorisable exp of a
  non-positive number (``numba_cpu.elu``'s phi(t) = exp(t) for t <= 0, one for each precision),
  where Numba's tanh is a C call per element; it also keeps its digits for negative x, where
  1 + tanh(y) cancels. With s the gate, gelu(x) = x s and
  gelu'(x) = s + 2 x s (1 - s) c (1 + 3 * 0.044715 x^2). ``gelu_gate`` is the one compiled
  gate: the token loop's kernels (``token_kernels``) use it too.
- Layer norm returns what its backward needs (xhat and 1 / std), so the backward
  recomputes nothing; GELU's backward recomputes s from its input, one exp an element.

Threads: GELU's loops and the heads' copies run in parallel over rows, whose results do not
depend on one another, so neither do they on the thread count; layer norm's backward sums
over a fixed number of blocks of rows, added in order; the embedding's backward runs on the
calling thread. Why these and not others: docs/performance.md. Float32 stays float32; no
fastmath (NaN in gives NaN out).
"""
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from ...numba_cpu.elu import phi
from ..layers import GELU_C, GELU_CUBIC, LAYER_NORM_EPS


class Normalised(NamedTuple):
    """What layer norm's backward needs: xhat (..., D), the normalised rows, and rstd (...),
    1 / sqrt(var + eps) of each row."""

    xhat: object
    rstd: object


def _as_rows(x):
    return x.reshape(-1, x.shape[-1])


# --- GELU ---------------------------------------------------------------------------------

@njit(cache=True, error_model="numpy", inline="always")    # inlined: vectorises in loops
def gelu_gate(x):
    """s = (1 + tanh(y)) / 2 = 1 / (1 + exp(-2 y)), y = c (x + 0.044715 x^3): the GELU gate,
    in x's type (float32 stays float32); gelu(x) = x s."""
    one = type(x)(1)
    y = type(x)(GELU_C) * (x + type(x)(GELU_CUBIC) * x * x * x)
    e = phi(-(y + y) if y >= 0 else y + y)                  # exp(-2 |y|), in (0, 1]
    return (one if y >= 0 else e) / (one + e)               # NaN in: NaN out


@njit(cache=True, error_model="numpy", inline="always")
def _gelu_grad(x):
    """gelu'(x) = s + x ds/dx, ds/dx = 2 s (1 - s) c (1 + 3 * 0.044715 x^2)."""
    s, one = gelu_gate(x), type(x)(1)
    two, three = one + one, one + one + one                 # in x's type: float32 stays
    c, cubic = type(x)(GELU_C), type(x)(GELU_CUBIC)
    return s + x * (two * s * (one - s) * c * (one + three * cubic * x * x))


# The element loops take each row as an argument: LLVM vectorises them then, and not a loop
# that writes into an array aliasing one it reads (docs/performance.md).
@njit(cache=True, error_model="numpy")
def _bias_gelu_row(u, b, g):
    """u += b and g = gelu(u), over one row."""
    for j in range(u.size):
        x = u[j] + b[j]
        u[j] = x
        g[j] = x * gelu_gate(x)


@njit(cache=True, error_model="numpy", parallel=True)
def _bias_gelu(u, b, g):
    for i in prange(u.shape[0]):
        _bias_gelu_row(u[i], b, g[i])


def bias_gelu(u, b):
    """u + b and GELU of it, tanh form (``layers.gelu``): the MLP's hidden layer after its
    matrix product.

    Parameters
    ----------
    u : ndarray, shape (..., F), C-contiguous
        h W1, overwritten with u + b (the pre-activation the backward needs).
    b : ndarray, shape (F,)

    Returns
    -------
    g : ndarray, shape (..., F), gelu(u + b)

    Cost: O(size(u)), one exp an element.
    """
    if not u.flags.c_contiguous:
        raise ValueError("bias_gelu overwrites u in place: u must be C-contiguous")
    g = np.empty_like(u)
    _bias_gelu(_as_rows(u), b, _as_rows(g))
    return g


@njit(cache=True, error_model="numpy")
def _times_gelu_grad_row(d, x):
    """d *= gelu'(x) over one row, in place."""
    for j in range(x.size):
        d[j] *= _gelu_grad(x[j])


@njit(cache=True, error_model="numpy", parallel=True)
def _times_gelu_grad(d, x):
    for i in prange(x.shape[0]):
        _times_gelu_grad_row(d[i], x[i])


def gelu_backward(dy, x, overwrite=False):
    """Gradient of GELU (``layers.gelu_backward``): dy * gelu'(x), in a new array, or in dy
    itself if ``overwrite`` (and dy is C-contiguous). Returns (dx,). Cost: O(size(x)), one
    exp an element."""
    dx = dy if overwrite and dy.flags.c_contiguous else np.array(dy, order="C")
    _times_gelu_grad(_as_rows(dx), _as_rows(x))
    return (dx,)


# --- layer norm ---------------------------------------------------------------------------

@njit(cache=True, error_model="numpy")
def _normalise_row(s, g, b, eps, y, xhat):
    """xhat = (s - mean) / sqrt(var + eps), y = xhat g + b over one row; returns rstd.
    Two passes, mean then variance, as ``layers._normalise``."""
    n, one = s.dtype.type(s.size), s.dtype.type(1)          # float32 stays float32
    total = s.dtype.type(0)
    for j in range(s.size):
        total += s[j]
    mu = total / n
    sq = s.dtype.type(0)
    for j in range(s.size):
        sq += (s[j] - mu) * (s[j] - mu)
    rstd = one / np.sqrt(sq / n + eps)
    for j in range(s.size):
        xh = (s[j] - mu) * rstd
        xhat[j] = xh
        y[j] = xh * g[j] + b[j]
    return rstd


@njit(cache=True, error_model="numpy", parallel=True)
def _add_layer_norm(x, a, bias, g, b, eps, s, y, xhat, rstd):
    """s = x + a + bias (if a has rows; else s is x), then its layer norm, row by row."""
    for i in prange(x.shape[0]):
        if a.shape[0]:
            for j in range(x.shape[1]):
                s[i, j] = x[i, j] + a[i, j] + bias[j]       # the residual add
        rstd[i] = _normalise_row(s[i], g, b, eps, y[i], xhat[i])


def _layer_norm(x, a, bias, g, b, eps):
    rows = _as_rows(x)
    s = rows if a is None else np.empty_like(rows)
    y, xhat, rstd = np.empty_like(rows), np.empty_like(rows), np.empty(len(rows), rows.dtype)
    a_rows = np.empty((0, rows.shape[1]), rows.dtype) if a is None else _as_rows(a)
    bias = np.zeros(rows.shape[1], rows.dtype) if bias is None else bias
    _add_layer_norm(rows, a_rows, bias, g, b, rows.dtype.type(eps), s, y, xhat, rstd)
    shape = x.shape
    return (s.reshape(shape), y.reshape(shape),
            Normalised(xhat.reshape(shape), rstd.reshape(shape[:-1])))


def layer_norm(x, g, b, eps=LAYER_NORM_EPS):
    """``layers.layer_norm`` that also returns what its backward needs.

    Parameters
    ----------
    x : ndarray, shape (..., D), C-contiguous
    g, b : ndarray, shape (D,)

    Returns
    -------
    y : ndarray, shape (..., D)
    saved : Normalised, (xhat (..., D), rstd (...))

    Cost: O(size(x)).
    """
    return _layer_norm(x, None, None, g, b, eps)[1:]


def add_layer_norm(x, a, bias, g, b, eps=LAYER_NORM_EPS):
    """The residual add and the next layer norm in one pass: s = x + a + bias, y = LN(s).

    Parameters
    ----------
    x, a : ndarray, shape (..., D), C-contiguous
        The residual stream and a branch's output (before its bias).
    bias, g, b : ndarray, shape (D,)

    Returns
    -------
    s : ndarray, shape (..., D), the new residual stream
    y : ndarray, shape (..., D), LN(s)
    saved : Normalised

    Cost: O(size(x)).
    """
    return _layer_norm(x, a, bias, g, b, eps)


# the backward's sums over rows (dg, db) are made in this many blocks of rows, whatever the
# number of threads, and the blocks' sums added in order: the same numbers on any machine
_ROW_BLOCKS = 16


@njit(cache=True, error_model="numpy", inline="always")
def _layer_norm_backward_row(dy, xhat, rstd, g, dx, dg, db):
    """dx of one row (dxhat = dy g), and its terms of dg += dy xhat, db += dy."""
    width = dy.size
    n = dy.dtype.type(width)
    s1 = s2 = dy.dtype.type(0)
    for j in range(width):
        dxh = dy[j] * g[j]                                 # dxhat
        s1 += dxh
        s2 += dxh * xhat[j]
        dg[j] += dy[j] * xhat[j]
        db[j] += dy[j]
    m1, m2 = s1 / n, s2 / n                                # mean(dxhat), mean(dxhat xhat)
    for j in range(width):
        dx[j] = rstd * (dy[j] * g[j] - m1 - xhat[j] * m2)


@njit(cache=True, error_model="numpy", parallel=True)
def _layer_norm_backward(dy, xhat, rstd, g, residual, dx, dg, db):
    """dx (plus ``residual`` if it has rows), and dg += dy xhat, db += dy over the rows."""
    rows, width = dy.shape
    blocks = min(_ROW_BLOCKS, rows)
    dg_part = np.zeros((blocks, width), dy.dtype)
    db_part = np.zeros((blocks, width), dy.dtype)
    for block in prange(blocks):
        for i in range(block * rows // blocks, (block + 1) * rows // blocks):
            _layer_norm_backward_row(dy[i], xhat[i], rstd[i], g, dx[i], dg_part[block],
                                     db_part[block])
            if residual.shape[0]:
                for j in range(width):
                    dx[i, j] += residual[i, j]             # the skip connection's gradient
    for block in range(blocks):                            # in order
        for j in range(width):
            dg[j] += dg_part[block, j]
            db[j] += db_part[block, j]


def layer_norm_backward(dy, saved, g, residual=None):
    """Gradients of ``layer_norm`` (``layers.layer_norm_backward``) from its saved xhat and
    rstd: dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dy g; with
    ``residual`` (a gradient reaching x by a skip connection) dx + residual.

    Returns
    -------
    dx : ndarray, shaped as dy
    dg, db : ndarray, shape (D,)

    Cost: O(size(dy)).
    """
    rows, width = _as_rows(dy), dy.shape[-1]
    dg, db, dx = np.zeros(width, dy.dtype), np.zeros(width, dy.dtype), np.empty_like(rows)
    res = np.empty((0, width), dy.dtype) if residual is None else _as_rows(residual)
    _layer_norm_backward(rows, _as_rows(saved.xhat), saved.rstd.reshape(-1), g, res, dx, dg,
                         db)
    return dx.reshape(dy.shape), dg, db


# --- heads: the projections' columns to (batch, head) rows and back ---------------------

@njit(cache=True, error_model="numpy", parallel=True)
def _heads_from_projections(proj, bias, n, out):
    """out[p, b, h, i] = proj[b n + i, (p H + h) d_head : ...] + bias[...]: one pass."""
    parts, batch, heads, _, width = out.shape
    for b in prange(batch):
        for i in range(n):
            row = proj[b * n + i]
            for part in range(parts):
                for h in range(heads):
                    col = (part * heads + h) * width
                    dst = out[part, b, h, i]
                    for j in range(width):
                        dst[j] = row[col + j] + bias[col + j]


def heads_from_projections(proj, bias, n, n_parts, n_heads):
    """P projections of B sequences of n positions, proj (B n, P d_model) + bias
    (P d_model,), as (P, B, H, n, d_head), each (batch, head) row contiguous as the attention
    kernels take it: the bias add and ``attention.split_heads`` of every part in one pass.
    Cost: O(size(proj))."""
    rows, cols = proj.shape
    out = np.empty((n_parts, rows // n, n_heads, n, cols // (n_parts * n_heads)), proj.dtype)
    _heads_from_projections(proj, bias, n, out)
    return out


@njit(cache=True, error_model="numpy", parallel=True)
def _projections_from_heads(part, offset, out):
    """out[b n + i, offset + h d_head + j] = part[b, h, i, j]."""
    batch, heads, n, width = part.shape
    for b in prange(batch):
        for i in range(n):
            row = out[b * n + i]
            for h in range(heads):
                col = offset + h * width
                for j in range(width):
                    row[col + j] = part[b, h, i, j]


def projections_from_heads(*parts):
    """P arrays (B, H, N, d_head), any strides, side by side as (B N, P d_model), position
    by position: ``attention.merge_heads`` of each, concatenated along the last axis, one
    pass per part (the inverse of ``heads_from_projections`` without its bias).
    Cost: O(P B N d_model)."""
    batch, heads, n, width = parts[0].shape
    out = np.empty((batch * n, len(parts) * heads * width), parts[0].dtype)
    for i, part in enumerate(parts):
        _projections_from_heads(part, i * heads * width, out)
    return out


# --- embedding ----------------------------------------------------------------------------

@njit(cache=True, error_model="numpy")
def _scatter_add(ids, dout, dtable):
    for r in range(ids.size):
        row = dtable[ids[r]]
        for j in range(row.size):
            row[j] += dout[r, j]


def embedding_backward(dout, ids, table):
    """``layers.embedding_backward`` by one loop over the positions, in order: dtable[ids[r]]
    += dout[r]. Returns (dtable,). Cost: O(size(dout) + size(table))."""
    dtable = np.zeros_like(table)
    _scatter_add(ids.reshape(-1), _as_rows(dout), dtable)
    return (dtable,)
