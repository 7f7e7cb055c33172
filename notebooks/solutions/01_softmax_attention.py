"""Our answers to the exercises of notebook 01 (softmax attention). The checks are in
``checks/01_softmax_attention.py``; try the exercises before reading on."""
import numpy as np


# ---- Exercise 1: the slopes of causal softmax attention ------------------------------------

def predicted_slopes():
    """NumPy computes all N^2 logits and masks them: the same work and memory as without the
    mask. Numba's loops skip the pairs j > i, about half of the N^2: half the multiply-adds once
    N is well above one tile (64), a constant factor, so the same slope; and
    it holds a few tiles at a time, so its memory grows like its output, N."""
    return {"numpy": {"time": 2.0, "memory": 2.0},
            "numba": {"time": 2.0, "memory": 1.0}}


# ---- Exercise 2: merging two partial softmaxes ----------------------------------------------

def merge(part_a, part_b):
    """(m, l, o) of the keys of both parts. Each part's terms were scaled by exp(-m) with its
    own maximum m; rescale both to the common maximum before adding."""
    m_a, l_a, o_a = part_a
    m_b, l_b, o_b = part_b
    m = np.maximum(m_a, m_b)
    scale_a, scale_b = np.exp(m_a - m), np.exp(m_b - m)          # both <= 1: no overflow
    return m, scale_a * l_a + scale_b * l_b, scale_a[..., None] * o_a + scale_b[..., None] * o_b


# ---- Exercise 3: softmax attention in tiles of keys -----------------------------------------

def softmax_attention_tiled(q, k, v, tile):
    """softmax(q k^T / sqrt(D)) v, Eq. (2), over blocks of ``tile`` keys, merged one block at
    a time: never more than an (Nq, tile) block of logits."""
    scale = q.shape[-1] ** -0.5
    part = None
    for start in range(0, k.shape[-2], tile):
        logits = q @ np.swapaxes(k[..., start:start + tile, :], -1, -2) * scale
        m = logits.max(axis=-1)
        weights = np.exp(logits - m[..., None])
        block = (m, weights.sum(axis=-1), weights @ v[..., start:start + tile, :])
        part = block if part is None else merge(part, block)
    _, l, o = part
    return o / l[..., None]
