"""Floors: what a kernel's time could fall to if only its matrix products cost anything.

``softmax_products`` makes the matrix products of the tiled softmax forward
(``linattn.numba_cpu.softmax``) and nothing else: the same tiles, with the BLAS held to one
thread where the forward holds it (``softmax.planned_tiles``), the same BLAS calls on operands
of the same shapes and layouts, the same units of work in parallel, without the element work
between the products (scaling, the running maxima, the exps and
the rescaling of the output). Its time against the whole forward's says how much of the
forward is products, and against a peer's forward, how close these products alone come.
"""
import numpy as np
from numba import njit, prange

from ...numba_cpu.blas import gemm
from ...numba_cpu.softmax import planned_tiles
from ..._checks import rows as as_rows


def softmax_products(q, k, v, causal):
    """The tiled softmax forward's products alone, on float arrays q (..., Nq, D),
    k (..., Nk, D), v (..., Nk, M) (causal: Nq == Nk): S^T = K_c Q_b^T, then O += P V_c
    with the tile S^T standing for P^T. Returns the (..., Nq, M) array it added into, whose
    values mean nothing."""
    q_rows, k_rows, v_rows = as_rows(q), as_rows(k), as_rows(v)
    out = np.zeros((*q_rows.shape[:-1], v.shape[-1]), dtype=v.dtype)
    with planned_tiles(q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]) as blocks:
        _products(q_rows, k_rows, v_rows, causal, *blocks, out)
    return out.reshape((*q.shape[:-1], v.shape[-1]))


@njit(parallel=True, cache=True)
def _products(q, k, v, causal, block_q, block_k, out):
    """Units (row, query block; causal: blocks b and n - 1 - b together) in parallel, as the
    forward deals them."""
    blocks = -(-q.shape[1] // block_q)
    per_row = (blocks + 1) // 2 if causal else blocks
    for unit in prange(q.shape[0] * per_row):
        _unit(np.int64(unit), q, k, v, causal, block_q, block_k, per_row, blocks, out)


@njit(cache=True)
def _unit(unit, q, k, v, causal, block_q, block_k, per_row, blocks, out):
    r, b = divmod(unit, per_row)
    scratch = np.empty(block_q * block_k, dtype=out.dtype)
    q_t = np.empty(block_q * q.shape[2], dtype=out.dtype)
    for half in range(2 if causal else 1):
        blk = b if half == 0 else blocks - 1 - b
        if half == 1 and blk == b:
            break
        i0 = blk * block_q
        i1 = min(q.shape[1], i0 + block_q)
        n = i1 - i0
        q_bt = q_t[:q.shape[2] * n].reshape(q.shape[2], n)
        q_bt[:] = q[r, i0:i1].T                     # Q_b^T (D, B), as the forward copies it
        stop = i1 if causal else k.shape[1]
        for j0 in range(0, stop, block_k):
            j1 = min(stop, j0 + block_k)
            st = scratch[:(j1 - j0) * n].reshape(j1 - j0, n)
            gemm(k[r, j0:j1], q_bt, st, 0)          # S^T = K_c Q_b^T (C, B)
            gemm(st.T, v[r, j0:j1], out[r, i0:i1], 1)   # O += P V_c (B, M)
