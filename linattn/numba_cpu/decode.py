"""One generated token through the transformer's blocks, in compiled calls that write into
buffers the generation loop owns: the lean path of ``linattn.model.generate`` (section 3.4
of Katharopoulos et al. (2020), arXiv:2006.16236, and Eq. (1) in its pre-norm form).

A block is three calls (two for every layer's matrices, one for its attention):
    norm_project     h = LN(x),  qkv = h [W_Q W_K W_V] + [b_Q b_K b_V]
    (attention)      linear: ``linattn.Recurrence.step`` per layer, Eq. (16)-(20);
                     softmax: ``cache_attend`` below, Eq. (2) for the one new query
    residual_mlp     x += heads W_O + b_O,  h = LN(x),  x += act(h W_1 + b_1) W_2 + b_2
and ``norm_project`` once more for the logits, LN(x) W_out + b_out.

Why compiled: at batch 1 a token is ~13 MFLOP against 25 MB of weights (the MNIST model,
d_model 256, 8 layers), so it is bound by reading the weights, ~1 ms on one core, and the
NumPy layers spent as long again in small calls (layer norm alone is five). Here each block
is two calls; the products stay BLAS (``blas.gemm``, the bias already in the output,
beta = 1), which reads a weight matrix once for all B rows, so batch 16 costs about what
batch 1 does in weight traffic. The element loops (layer norm, GELU, the softmax over the
cache) run along contiguous rows with no reduction across lanes where it matters, so LLVM
vectorises them without fastmath.

GELU is computed as x sigmoid(2 y), y = c (x + 0.044715 x^3): the same function as the
reference's 0.5 x (1 + tanh(y)), since (1 + tanh(y)) / 2 = 1 / (1 + exp(-2 y)); the sigmoid
needs one exp of a non-positive number (``flash_tiles.exp_nonpositive``, vectorisable), where
Numba's tanh is a C call per element (5.6 us for 1024 against NumPy's 0.6 us).

Oracle: ``linattn.model.generate.step`` (the NumPy layers), through tests/test_model_generate.py.
Arguments are the loop's own, already checked and C-contiguous.
"""
import numpy as np
from numba import njit

from .flash_tiles import exp_and_sum, exp_nonpositive, scale_and_max

LN_EPS = 1e-5              # as ``model.layers.layer_norm``
_GELU_C = np.sqrt(2 / np.pi)


@njit(cache=True, error_model="numpy")
def add_norm(x, y, bias, g, b, h):
    """The residual add and the layer norm after it, row by row over (B, D):

        x += y + bias                      y: a sublayer's product, bias: its bias (D,)
        h = g (x - mean) / sqrt(var + eps) + b

    Cost: O(B D), three passes over a row that stays in L1.
    """
    d = x.shape[1]
    for r in range(x.shape[0]):
        row, y_r, h_r = x[r], y[r], h[r]
        for i in range(d):
            row[i] += y_r[i] + bias[i]
        mu = row.sum() / d
        var = x.dtype.type(0)
        for i in range(d):
            var += (row[i] - mu) * (row[i] - mu)
        rstd = 1 / np.sqrt(var / d + x.dtype.type(LN_EPS))
        for i in range(d):
            h_r[i] = (row[i] - mu) * rstd * g[i] + b[i]


@njit(cache=True, error_model="numpy")
def bias_activate(u, bias, relu):
    """u = act(u + bias) in place over (B, F): ReLU, or GELU as x sigmoid(2 c (x + 0.044715
    x^3)) with x = u + bias. Cost: O(B F), one exp an element (GELU)."""
    c, one, zero = u.dtype.type(2 * _GELU_C), u.dtype.type(1), u.dtype.type(0)
    for r in range(u.shape[0]):
        row = u[r]
        for i in range(row.size):
            x = row[i] + bias[i]
            if relu:
                row[i] = x if x > 0 or x != x else zero           # NaN stays NaN
                continue
            s = c * (x + u.dtype.type(0.044715) * x * x * x)    # 2 y
            e = exp_nonpositive(-abs(s))                        # exp(-|2 y|) <= 1
            sig = one / (one + e) if s >= 0 else e / (one + e)  # sigmoid(2 y), no overflow
            row[i] = x * sig                                    # NaN in: NaN out


@njit(cache=True, error_model="numpy")
def cache_attend(qkv, t, keys_t, values, scale, scores, heads):
    """Softmax attention of position t's query over positions 0..t, Eq. (2) with one query
    (every cached key is visible: the causal mask, Eq. (8), has nothing to hide).

    qkv : (B, 3 D), this position's q | k | v, each laid out (H, d_head) along D.
    keys_t : (B, H, d_head, N_max)
        Keys stored transposed, so that the scores q . k_j run along j (vectorised).
    values : (B, H, N_max, d_head)
    scores : (N_max,) scratch; heads : (B, D), the output.

    k_t and v_t are first written into the caches at t. Then per head, with the one-query
    tile loops of ``flash_tiles`` (the library's softmax kernel's own):
        L_j = scale q . k_j,  P_j = exp(L_j - max L),  out = sum_j P_j v_j / sum_j P_j.
    Cost: O(B t D) time, reading the caches once.
    """
    n_batch, n_heads, d_head, _ = keys_t.shape
    d = n_heads * d_head
    n = t + 1
    scratch = np.empty((4, 1), dtype=scores.dtype)         # one query's running values
    top, m, total, rescale = scratch[0], scratch[1], scratch[2], scratch[3]
    col = scores[:n].reshape(n, 1)                            # (n, 1): keys x one query
    flat = scores[:n]                                         # the same, as a vector
    acc = np.empty(d_head, dtype=scores.dtype)
    for b in range(n_batch):
        for hd in range(n_heads):
            lo = hd * d_head
            q, k, v = qkv[b, lo:lo + d_head], qkv[b, d + lo:d + lo + d_head], \
                qkv[b, 2 * d + lo:2 * d + lo + d_head]
            kt, vals = keys_t[b, hd], values[b, hd]
            kt[:, t] = k                                      # the cache grows by one
            vals[t] = v
            flat[:] = 0
            for i in range(d_head):                           # q . k_j for every j <= t
                q_i, kt_i = q[i], kt[i]
                for j in range(n):
                    flat[j] += q_i * kt_i[j]
            top[0], m[0], total[0] = -np.inf, -np.inf, 0
            scale_and_max(col, scale, False, 0, 0, top)      # L = scale q k^T, its max
            exp_and_sum(col, top, m, total, rescale)          # P = exp(L - max), sum P
            acc[:] = 0
            for j in range(n):                                # sum_j P_j v_j
                p = flat[j]
                for i in range(d_head):
                    acc[i] += p * vals[j, i]
            out = heads[b, lo:lo + d_head]
            for i in range(d_head):
                out[i] = acc[i] / total[0]
