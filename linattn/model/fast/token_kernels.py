"""The element work of one generated token, between its matrix products: the compiled part
of the token loop of ``token_loop`` (``generate``'s "recurrent" and "cache" methods on the
lean path; section 3.4 of Katharopoulos et al. (2020), arXiv:2006.16236, and Eq. (1) in its
pre-norm form).

- ``add_norm``: the residual add and the layer norm after it, x += y + bias, h = LN(x);
- ``bias_activate``: the MLP's hidden layer, u = act(u + b_1);
- ``cache_attend``: softmax attention of the new query over the key/value cache, Eq. (2);
- ``product``: out = W^T x^T: one BLAS call, or for one column (B = 1) ``dot_rows``, a
  compiled product row by row, its rows split over Numba's threads.

Layout: a token's arrays are columns, (features, B), one column per sequence, as the loop
keeps them (``token_loop`` says why). So layer norm reduces along the features for every
sequence at once, its loops running along the batch, contiguous, with no reduction across
lanes, and the activation runs over the buffer flat: LLVM vectorises them without
fastmath. ``dot_rows``, a sum along each row of a weight matrix, alone allows
reassociation and contraction (fused multiply-adds).

GELU is x times the one compiled gate, ``fused.gelu_gate`` (the training path's): the
sigmoid form of the reference's 0.5 (1 + tanh(y)), with the library's exp of a
non-positive number. Layer norm's eps is ``layers.LAYER_NORM_EPS``. The softmax over the
cache reuses the one-query tile loops of the library's softmax kernel
(``numba_cpu.flash_tiles``), and ``product`` its BLAS binding (``numba_cpu.blas``): these
kernels are no attention of the dispatch table, only the token loops (``token_loop`` and
``rnn_token``) call them, so they live here, Numba-only by design.

Oracles: ``model.layers`` (layer_norm, gelu, relu) and ``linattn.softmax_attention``
(tests/test_model_token_kernels.py); the whole loop: ``model.token_step.step``. Arguments
are the loop's own, already checked, C-contiguous unless a docstring says otherwise.
"""
import numpy as np
from numba import njit, prange

from .fused import gelu_gate
from ..layers import LAYER_NORM_EPS
from ...numba_cpu.blas import gemm
from ...numba_cpu.flash_tiles import exp_and_sum, scale_and_max



@njit(cache=True, error_model="numpy")
def add_norm(x, y, bias, g, b, h):
    """The residual add and the layer norm after it, over the columns of (D, B) arrays:

        x += y + bias                      y: a sublayer's product, bias (D,) its bias
        h = g (x - mean) / sqrt(var + eps) + b,   mean and var over the D features

    Cost: O(D B), three passes over x.
    """
    d, n_batch = x.shape
    mean, var = np.zeros(n_batch, x.dtype), np.zeros(n_batch, x.dtype)
    for i in range(d):
        x_i, y_i, bias_i = x[i], y[i], bias[i]
        for c in range(n_batch):
            x_i[c] += y_i[c] + bias_i
            mean[c] += x_i[c]
    mean /= d
    for i in range(d):
        x_i = x[i]
        for c in range(n_batch):
            var[c] += (x_i[c] - mean[c]) * (x_i[c] - mean[c])
    rstd = 1 / np.sqrt(var / d + x.dtype.type(LAYER_NORM_EPS))       # (B,)
    for i in range(d):
        x_i, h_i, g_i, b_i = x[i], h[i], g[i], b[i]
        for c in range(n_batch):
            h_i[c] = (x_i[c] - mean[c]) * rstd[c] * g_i + b_i


@njit(cache=True, error_model="numpy", inline="always")     # inlined: vectorises in loops
def _activation(x, relu):
    """ReLU (NaN stays NaN), or GELU, x times its gate (``fused.gelu_gate``)."""
    if relu:
        return x if x > 0 or x != x else type(x)(0)
    return x * gelu_gate(x)                               # NaN in: NaN out


@njit(cache=True, error_model="numpy")
def bias_activate(u, bias, relu):
    """u = act(u + bias) in place over (F, B), bias (F,), u C-contiguous: ReLU, or GELU as
    x times its gate, x = u + bias. Cost: O(F B), an exp an element.

    With more than one column, the bias is added row by row and the activation then runs
    over u as one flat array, the same numbers: a loop along a row of a few columns never
    reaches the vectorised body LLVM makes for it (a vector's lanes, unrolled), so GELU
    ran one element at a time, with branches: 4.3 times as long an element at B = 4, 1.3
    at B = 16, in float32 on the machine of the performance page (AVX2)."""
    n_features, n_batch = u.shape
    if n_batch == 1:                      # one column, contiguous: the loop runs along it
        col = u.reshape(n_features)
        for f in range(n_features):
            col[f] = _activation(col[f] + bias[f], relu)
        return
    for f in range(n_features):
        row, bias_f = u[f], bias[f]
        for j in range(n_batch):
            row[j] += bias_f
    flat = u.reshape(u.size)
    for i in range(flat.size):
        flat[i] = _activation(flat[i], relu)


@njit(cache=True, error_model="numpy")
def cache_attend(qkv, t, keys_t, values, scale, scores, heads):
    """Softmax attention of position t's query over positions 0..t, Eq. (2) with one query
    (every cached key is visible: the causal mask, Eq. (8), has nothing to hide).

    qkv : (3 D, B), this position's q | k | v per sequence, each laid out (H, d_head).
    keys_t : (B, H, d_head, N_max)
        Keys stored transposed, so that the scores q . k_j run along j (vectorised).
    values : (B, H, N_max, d_head)
    scores : (N_max,) scratch; heads : (D, B), the output, heads laid out as q.

    k_t and v_t are first written into the caches at t. Then per sequence and head, with
    the one-query tile loops of ``flash_tiles`` (the library's softmax kernel's own):
        L_j = scale q . k_j,  P_j = exp(L_j - max L),  out = sum_j P_j v_j / sum_j P_j.
    Cost: O(B t D) time, one read of the caches (for long caches, bound by memory
    bandwidth).
    """
    n_batch, n_heads, d_head, _ = keys_t.shape
    d, n = n_heads * d_head, t + 1
    scratch = np.empty((4, 1), dtype=scores.dtype)         # one query's running values
    top, m, total, rescale = scratch[0], scratch[1], scratch[2], scratch[3]
    col = scores[:n].reshape(n, 1)                          # (n, 1): keys x one query
    flat = scores[:n]                                       # the same, as a vector
    q, acc = np.empty(d_head, dtype=scores.dtype), np.empty(d_head, dtype=scores.dtype)
    for b in range(n_batch):
        for hd in range(n_heads):
            lo = hd * d_head
            kt, vals = keys_t[b, hd], values[b, hd]
            for i in range(d_head):                         # the cache grows by one
                q[i] = qkv[lo + i, b]
                kt[i, t] = qkv[d + lo + i, b]
                vals[t, i] = qkv[2 * d + lo + i, b]
            flat[:] = 0
            for i in range(d_head):                         # q . k_j for every j <= t
                q_i, kt_i = q[i], kt[i]
                for j in range(n):
                    flat[j] += q_i * kt_i[j]
            top[0], m[0], total[0] = -np.inf, -np.inf, 0
            scale_and_max(col, scale, False, 0, 0, top)    # L = scale q k^T, its max
            exp_and_sum(col, top, m, total, rescale)        # P = exp(L - max), sum P
            acc[:] = 0
            for j in range(n):                              # sum_j P_j v_j
                p, v_j = flat[j], vals[j]
                for i in range(d_head):
                    acc[i] += p * v_j[i]
            for i in range(d_head):
                heads[lo + i, b] = acc[i] / total[0]


# reassociation lets LLVM vectorise each row's sum (partial sums along the row, added at
# the end) and contraction fuse its multiply-adds; nothing else: NaN and inf stay as IEEE
# has them
DOT_FLAGS = {"reassoc", "contract"}
# ``product``'s blocks of rows at one column, more than most machines have threads: Numba
# gives each thread a run of them (a call asking Numba for its thread count would keep
# the kernel out of its disk cache)
ROW_BLOCKS = 64


@njit(cache=True, error_model="numpy", fastmath=DOT_FLAGS)
def dot_rows(w, x, out, lo, hi):
    """out[i] = w[i] . x for the rows lo <= i < hi: w (N, K) C-contiguous, x (K,), out (N,)
    contiguous. Each row's sum is its own, in an order that depends on the vector width
    LLVM compiles for (as a BLAS's does) and not on which rows a call is given."""
    k = x.shape[0]
    for i in range(lo, hi):
        row = w[i]
        out[i] = 0
        total = out[i]                                  # 0 in out's dtype
        for j in range(k):
            total += row[j] * x[j]
        out[i] = total


@njit(cache=True, error_model="numpy", parallel=True)
def product(w, x, out):
    """out = w x for a token's columns, w (N, K) C-contiguous, x (K, B), out (N, B)
    C-contiguous.

    More than one column: one BLAS call, threaded by the BLAS. One column: ``dot_rows``,
    the rows in ``ROW_BLOCKS`` blocks spread over Numba's threads. A token at B = 1 reads
    all the model's weights once for one multiply-add each, so its products run at the
    memory's speed if anything can: as BLAS calls (OpenBLAS's product of one column, in
    two blocks of rows on two threads), the MNIST-shaped model's products took 2.6 times
    as long a token as ``dot_rows`` on the machine of the performance page (AVX2, 2
    threads, medians of 5 alternating runs). Every row is one ``dot_rows`` sum, so the
    numbers do not depend on the thread count. Cost: O(N K B).
    """
    n, k = w.shape
    if x.shape[1] != 1:
        gemm(w, x, out, 0)
        return
    column, result = np.ascontiguousarray(x).reshape(k), out.reshape(n)
    for block in prange(ROW_BLOCKS):
        dot_rows(w, column, result, block * n // ROW_BLOCKS, (block + 1) * n // ROW_BLOCKS)
