"""A whole generated token of a linear transformer with the paper's feature map, elu+1
(Eq. 7), as one compiled call: ``token_loop.token_logits``'s RNN branch, with no Python
between its layers.

Katharopoulos et al. (2020), arXiv:2006.16236, section 3.4: generating, each layer carries
the state (S, z) of Eq. (16)-(20) and a token costs the same at every position. What a token
computes is ``token_loop.token_logits`` line for line, with the same element kernels
(``token_kernels.add_norm`` and ``bias_activate``), the RNN step ``numba_cpu.step.step_into``
with elu+1 applied inside it, and the products as ``token_kernels.product`` makes them at one
column. Two things change:
- the loop over layers runs here, compiled, instead of in Python, where a token of the
  8-layer MNIST-shaped model makes about ten calls a layer, each paying Python's dispatch
  (and Numba's, for the compiled ones);
- with more than one sequence, a product is one BLAS call from Numba, which binds SciPy's
  OpenBLAS, where ``token_logits`` calls ``np.matmul`` and NumPy's OpenBLAS.
The step stays serial: running a batch's sequences on Numba's threads, between products
threaded by OpenBLAS, made a token at batch 16 many times slower on a 2-core machine.

So that one call can take every layer, the blocks' weights are stacked along a leading
axis of length L (``Stacked``), and the layers' states are two arrays, S (L, B, H, F, M)
and z (L, B, H, F) (``States``), updated in place.

Oracle: ``token_loop.token_logits`` with ``linattn.Recurrence`` memories, the same products
and kernels called from Python (tests/test_model_rnn_token.py), and through it the NumPy
``token_step.step``.
"""
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from . import token_kernels as kernels
from .token_kernels import ROW_BLOCKS, dot_rows
from ... import dispatch
from ...feature_maps import get_feature_map
from ...numba_cpu import step as step_kernel
from ...numba_cpu.blas import gemm
from ...numba_cpu.step import step_into

# the eps of Eq. (20)'s denominator: the library's default (``linattn.Recurrence``,
# ``linear_attention``), which the model's layers use
EPS = 1e-6


class Stacked(NamedTuple):
    """Every block's weights, ``token_loop.Block``'s, stacked along a first axis of length
    L: LN gains and biases (L, D), W_QKV^T (L, 3 D, D), b_QKV (L, 3 D), W_O^T (L, D, D),
    b_O (L, D), W_1^T (L, d_mlp, D), b_1 (L, d_mlp), W_2^T (L, D, d_mlp), b_2 (L, D), and
    the gain and bias of the layer norm that reads each block's output (L, D):
    ``Weights.out_norms``."""

    ln1_g: np.ndarray
    ln1_b: np.ndarray
    w_qkv: np.ndarray
    b_qkv: np.ndarray
    w_o: np.ndarray
    b_o: np.ndarray
    ln2_g: np.ndarray
    ln2_b: np.ndarray
    w_1: np.ndarray
    b_1: np.ndarray
    w_2: np.ndarray
    b_2: np.ndarray
    out_g: np.ndarray
    out_b: np.ndarray


class States(NamedTuple):
    """Every layer's RNN state, updated in place: S (L, B, H, F, M) and z (L, B, H, F),
    and scratch for one token's q, k, v and the heads' output, (B, H, d_head) each."""

    s: np.ndarray
    z: np.ndarray
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    out: np.ndarray


def fuses(cfg):
    """Whether ``cfg``'s tokens run here: linear attention with elu+1, which the step
    kernel applies itself (any other feature map runs through ``linattn.Recurrence``)."""
    return (cfg.attention == "linear"
            and dispatch.fuses(step_kernel, get_feature_map(cfg.feature_map)))


def stack(blocks, out_norms):
    """``Stacked`` from ``token_loop.Block``s and their ``out_norms`` (copies)."""
    def layers(get):
        return np.ascontiguousarray(np.stack([get(blk) for blk in blocks]))
    fields = [layers(lambda blk, f=f: getattr(blk, f)) for f in Stacked._fields[:12]]
    fields[3] = np.ascontiguousarray(fields[3][..., 0])          # b_QKV (L, 3 D, 1) -> (L, 3 D)
    return Stacked(*fields, np.stack([g for g, _ in out_norms]),
                   np.stack([b for _, b in out_norms]))


def states(cfg, b, start=None):
    """``States`` for a batch of b: S_0 = 0, z_0 = 0 (Eq. 16-17), or each layer's ``State``
    of ``start`` (what ``prefill.read_prompt`` returned)."""
    n_layers, h, dh = cfg.n_layers, cfg.n_heads, cfg.d_head
    s = np.zeros((n_layers, b, h, dh, dh), cfg.dtype)
    z = np.zeros((n_layers, b, h, dh), cfg.dtype)
    for layer, state in enumerate(start or ()):
        s[layer], z[layer] = state.S, state.z
    return States(s, z, *(np.empty((b, h, dh), cfg.dtype) for _ in range(4)))


@njit(cache=True, error_model="numpy", inline="always")
def _multiply(w, x, out):
    """out = w x, as ``token_kernels.product`` multiplies: one BLAS call, threaded by the
    BLAS, for more than one column; for one, ``token_kernels.dot_rows`` over
    ``ROW_BLOCKS`` blocks of rows spread over Numba's threads.

    Inlined into ``token``, whose ``prange`` this loop becomes, so that it is compiled with
    it, not linked from another cached parallel kernel: while this module was written,
    ``token`` calling ``token_kernels.product`` crashed a process (a segmentation fault) in
    which Numba compiled ``token`` and loaded ``product`` from its disk cache. ``dot_rows``
    is serial, and keeps its own fastmath flags (reassociation, contraction), which ``token``
    has not."""
    n, k = w.shape
    if x.shape[1] != 1:
        gemm(w, x, out, 0)
        return
    column, result = x.reshape(k), out.reshape(n)      # ``token``'s columns: contiguous
    for block in prange(ROW_BLOCKS):
        dot_rows(w, column, result, block * n // ROW_BLOCKS, (block + 1) * n // ROW_BLOCKS)


@njit(cache=True, error_model="numpy", inline="always")
def _split_heads(qkv, bias, q, k, v):
    """q, k, v (B, H, d_head) = the columns of qkv (3 D, B) + b_QKV (3 D,), split into
    heads. The loop runs along qkv's rows, which it reads in order, and writes q, k, v with
    a stride: the other order (along each column of qkv, a stride of B floats a read) took
    2.6 times as long at B = 16 on the machine of the performance page."""
    n_batch = q.shape[0]
    d = q.shape[1] * q.shape[2]
    for part, dest in ((0, q), (1, k), (2, v)):
        rows = dest.reshape(n_batch, d)                 # (B, D): feature hd * d_head + j
        for i in range(d):
            feature, bias_i = qkv[part * d + i], bias[part * d + i]
            for c in range(n_batch):
                rows[c, i] = feature[c] + bias_i


@njit(cache=True, error_model="numpy", parallel=True)
def token(st, tok_emb_t, position, w_out, b_out, tokens, mem, eps, relu,
          x, h, y, qkv, heads, hidden, logits):
    """Next-token logits into ``logits`` (V, B) from ``tokens`` (B,) at one position:
    ``token_loop.token_logits`` for linear attention with elu+1, every layer in one call.

    st : Stacked; tok_emb_t (D, V); position (D,), this position's encoding; w_out (V, D),
    b_out (V, 1); mem : States, updated in place; eps of the dtype; relu : bool (else GELU);
    x, h, y, heads (D, B), qkv (3 D, B), hidden (d_mlp, B): ``token_loop.Buffers``' arrays.

    Per layer, pre-norm (Eq. 1): q | k | v = h W_QKV + b_QKV, the RNN step (Eq. 18-20,
    elu+1 inside), x += heads W_O + b_O, h = LN(x), x += act(h W_1 + b_1) W_2 + b_2,
    h = LN(x). Cost: O(L B d_model (4 d_model + 2 d_mlp) + B d_model V) for the products,
    O(L B d_model d_head) for the steps.
    """
    d, n_batch = x.shape
    n_heads, d_head = mem.q.shape[1], mem.q.shape[2]
    for c in range(n_batch):                            # x_0 = token embedding + position
        for i in range(d):
            y[i, c] = tok_emb_t[i, tokens[c]]
    x[:] = 0
    kernels.add_norm(x, y, position, st.ln1_g[0], st.ln1_b[0], h)
    for layer in range(st.w_qkv.shape[0]):
        _multiply(st.w_qkv[layer], h, qkv)
        _split_heads(qkv, st.b_qkv[layer], mem.q, mem.k, mem.v)
        step_into(mem.q, mem.k, mem.v, mem.s[layer], mem.z[layer], mem.out, eps, True)
        for c in range(n_batch):                        # the heads' outputs as columns
            for hd in range(n_heads):
                for j in range(d_head):
                    heads[hd * d_head + j, c] = mem.out[c, hd, j]
        _multiply(st.w_o[layer], heads, y)
        kernels.add_norm(x, y, st.b_o[layer], st.ln2_g[layer], st.ln2_b[layer], h)
        _multiply(st.w_1[layer], h, hidden)
        kernels.bias_activate(hidden, st.b_1[layer], relu)
        _multiply(st.w_2[layer], hidden, y)
        kernels.add_norm(x, y, st.b_2[layer], st.out_g[layer], st.out_b[layer], h)
    _multiply(w_out, h, logits)
    for v in range(logits.shape[0]):
        for c in range(n_batch):
            logits[v, c] += b_out[v, 0]
