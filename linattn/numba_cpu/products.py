"""The paper's "causal product" and its non-causal twin as Numba loops: Eq. (9)-(12) of
Katharopoulos et al. (2020), arXiv:2006.16236, for any three operands a, b, c:

    out_i = c_i^T S_i,   S_i = sum_{j <= i} a_j b_j^T     (j >= i if ``reverse``; all j if global)

The forward pass is (a, b, c) = (phi_k, v, phi_q). The backward of section 3.3.1, Eq. (13)-(15),
is three more products of the same shape (see ``normaliser``), so these two loops are all the
Numba backend computes. With ``eps >= 0`` the loops also normalise, Eq. (12):
out_i /= c_i^T z_i + eps with z_i = sum_j a_j, and write that denominator to ``den``.

Layout: a, c (R, N, A); b (R, N, >= B); out (R, N, B); den (R, N) (the global product reads
out c of any length Nc: out (R, Nc, B), den (R, Nc)); R rows are the flattened
batch x heads. Work is split into R x ``n_blocks`` units, each owning a block of the state
(rows of A for the causal scan, columns of B for the global sums), so two cores stay busy
even at R = 1. The inner loops run along b's columns (SIMD, no reduction), with two partial
sums for the readout to break the add chain; no fastmath, so NaN and inf behave as in NumPy
and float32 stays float32. Oracle: ``forms.quadratic``.
"""
import numpy as np
from numba import njit, prange


@njit(parallel=True, cache=True, error_model="numpy")
def causal_product(a, b, c, reverse, eps, out, den, n_blocks, start):
    """out_i = c_i^T (S0 + sum_{j <= i} a_j b_j^T) (j >= i if reverse), normalised if
    eps >= 0 by c_i^T (z0 + sum_{j <= i} a_j) + eps.

    ``start`` holds the state the scan starts from, a state handed over (Eq. 20): S0 =
    start[r, :, :B] (R, A, >= B), and when normalising z0 = start[r, :, B] (R, A, B + 1:
    [S0, z0]); an empty (0, 0, 0) array starts from zeros.

    Each unit owns a block of the state's rows (the A axis) and all its columns, so inner
    loops keep their full length; with several blocks per row their partial readouts
    c_i[rows]^T S_i[rows] (and partial denominators) are summed after the scan. Positions go
    in pairs: one sweep over the state serves two of them, S_i then S_{i+1} (an odd last
    position is paired with zeros). Cost: O(R N A B) time; O(A B) memory per unit, never a
    state per position (section 3.3.1), plus n_blocks partial outputs when n_blocks > 1.
    """
    rows, n, width_a = a.shape
    width_b = out.shape[2]
    block = -(-width_a // n_blocks)
    split = n_blocks > 1
    parts = np.empty((n_blocks if split else 0, rows, n, width_b), dtype=out.dtype)
    den_parts = np.empty((n_blocks if split else 0, rows, n), dtype=out.dtype)
    for unit in prange(rows * n_blocks):
        r, blk = divmod(np.int64(unit), n_blocks)  # prange counts unsigned
        f0 = blk * block
        f1 = min(width_a, f0 + block)
        state = np.zeros((f1 - f0, width_b), dtype=out.dtype)   # S_i, rows f0 .. f1
        z = np.zeros(f1 - f0, dtype=out.dtype)                  # z_i = sum_j a_j, Eq. (11)
        if start.shape[0] > 0:                                  # S0 + S_i, z0 + z_i
            state[:] = start[r, f0:f1, :width_b]
            if eps >= 0:
                z[:] = start[r, f0:f1, width_b]
        acc = np.empty((2, 2, width_b), dtype=out.dtype)        # (position, parity, column)
        none_a, none_b = np.zeros(width_a, dtype=a.dtype), np.zeros(width_b, dtype=b.dtype)
        for t in range(0, n, 2):
            i, j = (n - 1 - t, n - 2 - t) if reverse else (t, t + 1)
            a_i, b_i, c_i = a[r, i], b[r, i, :width_b], c[r, i]   # row views keep it SIMD
            a_j, b_j, c_j = none_a, none_b, none_a
            if t + 1 < n:
                a_j, b_j, c_j = a[r, j], b[r, j, :width_b], c[r, j]
            acc[:] = 0
            d_i = d_j = eps if blk == 0 else eps - eps         # eps joins one block's sum
            for f in range(f0, f1):
                ai, aj, ci, cj = a_i[f], a_j[f], c_i[f], c_j[f]
                s_row = state[f - f0]
                part_i, part_j = acc[0, f % 2], acc[1, f % 2]   # two partial sums each
                for m in range(width_b):
                    s = s_row[m] + ai * b_i[m]      # S_i = S_{i-1} + a_i b_i^T, Eq. (10)
                    part_i[m] += ci * s             # c_i^T S_i, Eq. (12)
                    s = s + aj * b_j[m]             # S_{i+1}
                    part_j[m] += cj * s
                    s_row[m] = s
                z[f - f0] += ai
                d_i += ci * z[f - f0]               # c_i^T z_i + eps
                z[f - f0] += aj
                d_j += cj * z[f - f0]
            if split:
                _sum_parts(acc[0], parts[blk, r, i])
                den_parts[blk, r, i] = d_i
                if t + 1 < n:
                    _sum_parts(acc[1], parts[blk, r, j])
                    den_parts[blk, r, j] = d_j
            else:
                _finish(acc[0], d_i, eps, out[r, i], den[r:r + 1, i])
                if t + 1 < n:
                    _finish(acc[1], d_j, eps, out[r, j], den[r:r + 1, j])
    if split:
        for unit in prange(rows * n):                  # add the blocks' partial readouts
            r, i = divmod(np.int64(unit), n)
            for blk in range(1, n_blocks):
                parts[0, r, i] += parts[blk, r, i]
                den_parts[0, r, i] += den_parts[blk, r, i]
            _finish(parts[0, r, i:i + 1], den_parts[0, r, i], eps, out[r, i], den[r:r + 1, i])


@njit(cache=True, error_model="numpy")
def _sum_parts(parts, out_row):
    """out_row = parts[0] + parts[1]: the two partial sums of a readout."""
    for m in range(out_row.size):
        out_row[m] = parts[0, m] + parts[1, m]


@njit(cache=True, error_model="numpy")
def _finish(parts, d, eps, out_row, den_cell):
    """out_row = sum(parts) / d and den_cell[0] = d when normalising (eps >= 0), else
    out_row = sum(parts): parts is (1 or 2, B)."""
    for m in range(out_row.size):
        total = parts[0, m]
        for p in range(1, parts.shape[0]):
            total += parts[p, m]
        out_row[m] = total / d if eps >= 0 else total
    if eps >= 0:
        den_cell[0] = d


@njit(parallel=True, cache=True, error_model="numpy")
def global_product(a, b, c, eps, out, den, n_blocks):
    """out_i = c_i^T sum_j a_j b_j^T over all j, normalised if eps >= 0: Eq. (5)-(6).

    Two phases: accumulate S = sum_j a_j b_j^T and z (units over column blocks), then read
    every position out (units over blocks of positions). Cost: O(R N A B) time, O(R A B) memory.
    """
    rows, n, width_a = a.shape
    width_b = out.shape[2]
    state = np.zeros((rows, width_a, width_b), dtype=out.dtype)
    z = np.zeros((rows, width_a), dtype=out.dtype)
    block = -(-width_b // n_blocks)
    for unit in prange(rows * n_blocks):
        r, blk = divmod(np.int64(unit), n_blocks)  # prange counts unsigned
        b0 = blk * block
        b1 = min(width_b, b0 + block)
        for j in range(n):
            a_j, b_j = a[r, j], b[r, j, b0:b1]
            for f in range(width_a):
                af = a_j[f]
                s_row = state[r, f, b0:b1]
                for m in range(b1 - b0):
                    s_row[m] += af * b_j[m]                # S = sum_j a_j b_j^T, Eq. (6)
                if blk == 0:
                    z[r, f] += af                          # z = sum_j a_j
    n_c = c.shape[1]                                       # readouts: c may be longer or shorter
    span = -(-n_c // n_blocks)
    for unit in prange(rows * n_blocks):
        r, blk = divmod(np.int64(unit), n_blocks)
        acc = np.empty((2, width_b), dtype=out.dtype)
        for i in range(blk * span, min(n_c, (blk + 1) * span)):
            c_i, out_i = c[r, i], out[r, i]
            acc[:] = 0
            d = eps
            for f in range(width_a):
                cf = c_i[f]
                s_row = state[r, f]
                part = acc[f % 2]
                for m in range(width_b):
                    part[m] += cf * s_row[m]               # c_i^T S, Eq. (5)
                d += cf * z[r, f]                          # c_i^T z + eps
            for m in range(width_b):
                out_i[m] = acc[0, m] + acc[1, m]
                if eps >= 0:
                    out_i[m] /= d
            if eps >= 0:
                den[r, i] = d
