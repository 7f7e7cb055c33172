"""The compiled token loop behind ``generate``'s "recurrent" and "cache" methods on the lean
path: the reference ``token_step.step``, reorganised so that a token does no work a token
need not do.

Katharopoulos et al. (2020), arXiv:2006.16236, section 3.4: a linear transformer generates
like an RNN, each layer carrying its state (S, z) of Eq. (16)-(20); a softmax one keeps its
keys and values. ``step`` computes a token from the parameter dict with the NumPy layers,
validating, splitting heads and allocating as it goes. Here that is done once per call of
``generate``:
- ``prepare``: the weights in the model dtype, C-contiguous and transposed, (out, in);
  W_Q, W_K, W_V joined into one (3 d_model, d_model) matrix (one product instead of three);
  the position encodings of every position the loop will read; with elu+1, a second copy
  of the blocks' weights stacked by layer (``rnn_token.Stacked``);
- ``buffers``: every per-token array (the residual stream x, LN(x), q | k | v, the heads'
  outputs, the MLP's hidden layer, the logits) allocated for the batch;
- ``memories``: one ``linattn.Recurrence`` per layer (lead shape (B, H), its state updated
  in place, Eq. 18-19), or one ``SoftmaxCache`` per layer, filled a position at a time;
  with elu+1, every layer's state in two arrays instead (``rnn_token.States``); all start
  from the prompt, read in one parallel pass per layer (``prefill.read_prompt``): the
  states from its state, the cache with its keys and values.
Then ``token_logits`` per token: per block four products, the attention, and the
element work between them (three compiled calls of ``token_kernels``, two NumPy adds of a
bias); with elu+1, the same
work in one compiled call for the whole token (``rnn_token.token``). ``next_logits`` runs
it over a sequence, as ``token_step.next_logits`` runs ``step``.

Layout: a token's arrays are columns, (features, B), and every product is
out^T = W^T in^T, with W^T (out, in) C-contiguous: the same result as x W, in the
orientation OpenBLAS multiplies faster for a batch of a few columns. At B = 1 a product is
``token_kernels.product``'s, row by row on Numba's threads (a BLAS product of one column
reads the weights well below the memory's speed); at larger B NumPy's one call stays
(``rnn_token``'s one call from Numba). The performance page (docs/performance.md)
compares a token's time with its products alone.

Oracle: ``token_step.step``; tests/test_model_generate.py holds the two to each other.
"""
from typing import NamedTuple

import numpy as np

from . import rnn_token, token_kernels as kernels
from .attention import check_compiled
from ...recurrence import Recurrence
from ..prefill import read_prompt
from ..transformer import block_params, sinusoidal_positions


class Block(NamedTuple):
    """One block's weights as the loop takes them: LN gains and biases (D,), the matrices
    transposed, (out, in): W_QKV^T (3 D, D), W_O^T (D, D), W_1^T (F, D), W_2^T (D, F), and
    their biases, b_QKV as a column (3 D, 1), b_O (D,), b_1 (F,), b_2 (D,)."""

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


class Weights(NamedTuple):
    """The whole model: token embeddings transposed (D, V), position encodings (N, D) of
    positions 0..N-1, the blocks, the output projection W_out^T (V, D) and its bias as a
    column (V, 1); ``out_norms`` holds, for each block, the (gain, bias) of the layer norm
    that reads its output: the next block's first, or, after the last block, the final one.
    ``stacked``: the blocks as ``rnn_token.Stacked`` for the models whose tokens run as one
    compiled call (``rnn_token.fuses``), else None."""

    tok_emb_t: np.ndarray
    positions: np.ndarray
    blocks: tuple
    out_norms: tuple
    w_out: np.ndarray
    b_out: np.ndarray
    stacked: object = None


class Buffers(NamedTuple):
    """Per-token arrays for a batch of B, one column per sequence: the residual stream x,
    its normalised form h, a sublayer's product y and the heads' outputs (D, B), qkv
    (3 D, B), hidden (F, B), logits (V, B), and the scores of one query against the
    cache (N,); q, k, v are views of qkv's three parts as the RNN takes them,
    (B, H, d_head)."""

    x: np.ndarray
    h: np.ndarray
    y: np.ndarray
    qkv: np.ndarray
    heads: np.ndarray
    hidden: np.ndarray
    logits: np.ndarray
    scores: np.ndarray
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray


class SoftmaxCache(NamedTuple):
    """One softmax layer's memory: keys stored transposed, (B, H, d_head, N), and values
    (B, H, N, d_head); positions 0..t are filled after the token at t."""

    keys_t: np.ndarray
    values: np.ndarray


def prepare(params, cfg, n_positions):
    """``Weights`` from the parameter dict, in ``cfg.dtype``, for positions 0..n_positions-1."""
    def c(a):
        return np.ascontiguousarray(a, dtype=cfg.dtype)

    def t(w):                                     # (in, out) -> (out, in), C-contiguous
        return c(w.T)

    if cfg.positions == "learned":
        positions = params["pos_emb"][:n_positions]
    else:
        positions = sinusoidal_positions(0, n_positions, cfg.d_model, cfg.dtype)
    blocks = []
    for layer in range(cfg.n_layers):
        p = block_params(params, layer)
        blocks.append(Block(
            c(p["ln1_g"]), c(p["ln1_b"]),
            t(np.concatenate([p["wq"], p["wk"], p["wv"]], axis=1)),     # (3 D, D)
            c(np.concatenate([p["bq"], p["bk"], p["bv"]])[:, None]),
            t(p["wo"]), c(p["bo"]), c(p["ln2_g"]), c(p["ln2_b"]),
            t(p["w1"]), c(p["b1"]), t(p["w2"]), c(p["b2"])))
    out_norms = [(blk.ln1_g, blk.ln1_b) for blk in blocks[1:]]
    out_norms.append((c(params["lnf_g"]), c(params["lnf_b"])))
    stacked = rnn_token.stack(blocks, out_norms) if rnn_token.fuses(cfg) else None
    return Weights(t(params["tok_emb"]), c(positions), tuple(blocks), tuple(out_norms),
                   t(params["w_out"]), c(params["b_out"][:, None]), stacked)


def buffers(cfg, b, n_positions):
    """Empty ``Buffers`` for a batch of b sequences of up to n_positions."""
    d = cfg.d_model

    def empty(*shape):
        return np.empty(shape, dtype=cfg.dtype)

    qkv = empty(3 * d, b)
    q, k, v = (qkv[i * d:(i + 1) * d].T.reshape(b, cfg.n_heads, cfg.d_head) for i in range(3))
    return Buffers(empty(d, b), empty(d, b), empty(d, b), qkv, empty(d, b),
                   empty(cfg.d_mlp, b), empty(cfg.vocab_size, b), empty(n_positions), q, k, v)


def memories(cfg, b, n_positions, start=None):
    """Each layer's memory: a ``Recurrence`` (linear) or a ``SoftmaxCache`` (softmax) with room
    for n_positions; empty (S_0 = 0, z_0 = 0, Eq. 16-17) or, given ``start`` (what
    ``prefill.read_prompt`` returned for P positions), holding them: the Recurrence starts
    from the state S_P, z_P, the cache's first P positions hold the keys and values. With
    elu+1 (``rnn_token.fuses``), one ``rnn_token.States`` for all layers instead."""
    if rnn_token.fuses(cfg):
        return rnn_token.states(cfg, b, start)
    h, dh = cfg.n_heads, cfg.d_head
    start = start or (None,) * cfg.n_layers
    if cfg.attention == "linear":
        return tuple(Recurrence((b, h), dh, dh, feature_map=cfg.feature_map, dtype=cfg.dtype,
                                initial_state=state) for state in start)
    caches = []
    for read in start:
        cache = SoftmaxCache(np.zeros((b, h, dh, n_positions), cfg.dtype),
                             np.zeros((b, h, n_positions, dh), cfg.dtype))
        if read is not None:
            k, v = read                                          # (B, H, P, d_head) each
            cache.keys_t[..., :k.shape[2]] = k.transpose(0, 1, 3, 2)
            cache.values[:, :, :v.shape[2]] = v
        caches.append(cache)
    return tuple(caches)


def _matmul(w, x, out):
    """out = w x by NumPy's BLAS call, which splits it over its own threads."""
    np.matmul(w, x, out=out)


def _multiply(b):
    """The loop's out = w x for a batch of b columns: ``token_kernels.product`` (row by
    row on Numba's threads) at b = 1, NumPy's single BLAS call otherwise."""
    return kernels.product if b == 1 else _matmul


def token_logits(weights, buf, memories, cfg, tokens, t):
    """Next-token logits (B, V) from the tokens (B,) at position t: ``token_step.step``'s
    result, a view of ``buf.logits`` (overwritten by the next call). Updates ``memories``
    in place.

    With ``rnn_token.States`` memories (elu+1), one compiled call, ``rnn_token.token``, does
    all of this. Per block, as ``transformer.block`` (pre-norm, Eq. 1), with h = LN(x)
    already made by the previous ``add_norm``: q | k | v = h W_QKV + b_QKV, the attention,
    x += heads W_O + b_O, h = LN(x), x += act(h W_1 + b_1) W_2 + b_2, and h = LN(x) for what
    comes next; every product as out^T = W^T in^T on columns.

    Cost per token: O(L B d_model (4 d_model + 2 d_mlp) + B d_model V) for the products,
    plus O(L B d_model d_head) (linear) or O(L B t d_model) (softmax) for the attention.
    """
    b, d = buf.x.shape[1], cfg.d_model
    relu, scale = cfg.activation == "relu", buf.x.dtype.type(cfg.d_head ** -0.5)
    if isinstance(memories, rnn_token.States):          # every layer in one compiled call
        rnn_token.token(weights.stacked, weights.tok_emb_t, weights.positions[t],
                        weights.w_out, weights.b_out, tokens, memories,
                        buf.x.dtype.type(rnn_token.EPS), relu, buf.x, buf.h, buf.y, buf.qkv,
                        buf.heads, buf.hidden, buf.logits)
        return buf.logits.T
    first = weights.blocks[0]
    multiply = _multiply(b)
    np.take(weights.tok_emb_t, tokens, axis=1, out=buf.y)
    buf.x.fill(0)                                       # x_0 = token embedding + position
    kernels.add_norm(buf.x, buf.y, weights.positions[t], first.ln1_g, first.ln1_b, buf.h)
    for blk, (out_g, out_b), memory in zip(weights.blocks, weights.out_norms, memories):
        multiply(blk.w_qkv, buf.h, buf.qkv)
        np.add(buf.qkv, blk.b_qkv, out=buf.qkv)         # q | k | v, (3 D, B)
        if cfg.attention == "linear":                   # the RNN, Eq. (16)-(20)
            heads = memory.step(buf.q, buf.k, buf.v).reshape(b, d).T     # (D, B)
        else:                                           # the new query against the cache
            kernels.cache_attend(buf.qkv, t, memory.keys_t, memory.values, scale,
                                 buf.scores, buf.heads)
            heads = buf.heads
        multiply(blk.w_o, heads, buf.y)
        kernels.add_norm(buf.x, buf.y, blk.b_o, blk.ln2_g, blk.ln2_b, buf.h)
        multiply(blk.w_1, buf.h, buf.hidden)
        kernels.bias_activate(buf.hidden, blk.b_1, relu)           # f_l's hidden layer
        multiply(blk.w_2, buf.hidden, buf.y)
        kernels.add_norm(buf.x, buf.y, blk.b_2, out_g, out_b, buf.h)
    multiply(weights.w_out, buf.h, buf.logits)
    np.add(buf.logits, weights.b_out, out=buf.logits)
    return buf.logits.T


def token_products(weights, buf):
    """The matrix products of one ``token_logits`` call and nothing else, on whatever the
    buffers hold (for the heads' product, ``buf.heads`` C-ordered, where the RNN's output is
    a transposed view): a token's time without its attention and element work, the floor
    ``linattn.lab.speed`` reports beside the RNN. Cost: O(L B d_model (4 d_model + 2 d_mlp) +
    B d_model V)."""
    multiply = _multiply(buf.x.shape[1])
    for blk in weights.blocks:
        multiply(blk.w_qkv, buf.h, buf.qkv)
        multiply(blk.w_o, buf.heads, buf.y)
        multiply(blk.w_1, buf.h, buf.hidden)
        multiply(blk.w_2, buf.hidden, buf.y)
    multiply(weights.w_out, buf.h, buf.logits)


def next_logits(params, cfg, tokens, n_prompt=1):
    """Yield the next-token logits (B, V) of positions t = n_prompt-1..N-2 of ``tokens``
    (B, N) by ``token_logits``, reading ``tokens[:, t]`` only when asked for position t's
    logits (the caller may write the token it samples at t + 1 in between); the positions
    before, 0..n_prompt-2, are read at once by ``prefill.read_prompt``:
    ``token_step.next_logits`` on the compiled path. Each yielded array is overwritten by
    the next. The attentions beyond the paper are refused (``attention.check_compiled``)."""
    b, n = tokens.shape
    weights = prepare(params, check_compiled(cfg), n - 1)
    buf = buffers(cfg, b, n - 1)
    read = read_prompt(params, cfg, tokens[:, :n_prompt - 1]) if n_prompt > 1 else None
    state = memories(cfg, b, n - 1, read)       # the prompt's, or S_0 = z_0 = 0 / empty
    for t in range(n_prompt - 1, n - 1):
        yield token_logits(weights, buf, state, cfg, tokens[:, t], t)
