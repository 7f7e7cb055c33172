"""v2 of the CUDA causal product: a chunked scan with the normaliser fused, for causal linear
attention, Eq. (9)-(12) forward and Eq. (13)-(15) backward of Katharopoulos et al. (2020),
arXiv:2006.16236. This is ``method="chunked"`` (and ``"auto"``) with ``backend="cupy"``.

The sequence is cut into chunks of TILE = 64 positions; the kernels of causal_product.cu run in
three steps, each parallel over chunks, heads and 64-wide tiles of F or M:

1. ``chunk_states``: each chunk's K_c^T V_c (F, M) and sum of k (F), Eq. (10)-(11) over a chunk;
2. ``chunk_scan``: their exclusive prefix over chunks, S_c and z_c, the state entering chunk c;
3. ``chunk_forward``: out_c = (Q_c S_c + tril(Q_c K_c^T) V_c) / den_c with
   den_c = Q_c z_c + rowsum(tril(Q_c K_c^T)) + eps.

The backward recomputes the states (section 3.3.1), runs the same two steps backwards in time
for G_c = sum over later chunks of Q^T dnum, and then ``chunk_backward_qk`` and
``chunk_backward_v``. Memory: O(N F M / 64) for the chunk states, never a state per position.
Causal only: the dispatch table sends non-causal calls to NumPy's forms on CuPy arrays.
Oracle: the NumPy backend (``linattn.forms.chunked`` computes the same blocks).
"""
import math

import numpy as np

from .._checks import rows
from . import launch

FUSED_FEATURE_MAPS = ()  # every feature map is applied before the kernel
SUPPORTS = frozenset()  # causal only: dispatch sends the rest to NumPy's forms


def _states(x, y, w, reverse):
    """Chunk states: s_c = sum_{c' < c} X_c'^T Y_c' (c' > c if ``reverse``) and z_c, the same
    with Y = w (ones if None).

    Shapes: x (H, N, P), y (H, N, R), w (H, N) or None -> s (H, NC, P, R), z (H, NC, P),
    NC = ceil(N / TILE).
    """
    xp = launch.array_module(x)
    h, n, p = x.shape
    r = y.shape[-1]
    nc = math.ceil(n / launch.TILE)
    s = xp.empty((h, nc, p, r), dtype=x.dtype)
    z = xp.empty((h, nc, p), dtype=x.dtype)
    grid = (h * nc, math.ceil(p / launch.TILE), math.ceil(r / launch.TILE))
    launch.launch("causal_product.cu", "chunk_states", grid, (x, y, w, s, z, n, p, r))
    for a in (s, z):                                        # prefix over chunks, in place
        e = a[0, 0].size
        launch.launch("causal_product.cu", "chunk_scan", (launch.blocks(h * e),),
                      (a, h, nc, np.int64(e), int(reverse)))
    return s, z


def _forward(q, k, v, eps):
    """out (H, N, M), den (H, N) and the forward states S_c, z_c, from (H, N, .) arrays."""
    xp = launch.array_module(v)
    h, n, f = q.shape
    m = v.shape[-1]
    s, z = _states(k, v, None, reverse=False)
    out = xp.empty_like(v)
    den = xp.empty((h, n), dtype=v.dtype)
    grid = (h * math.ceil(n / launch.TILE), math.ceil(m / launch.TILE))
    launch.launch("causal_product.cu", "chunk_forward", grid,
                  (q, k, v, s, z, out, den, n, f, m, float(eps)))
    return out, den, s, z


def attend(phi_q, phi_k, v, *, causal, eps, chunk_size=None):
    """Normalised linear attention, Eq. (5) / (9), on CuPy arrays.

    Parameters
    ----------
    phi_q, phi_k : cupy.ndarray, shape (..., N, F), positive features
    v : cupy.ndarray, shape (..., N, M)

    Returns
    -------
    out : cupy.ndarray, shape (..., N, M)

    Cost: O(N (64 (F + M) + F M)) time, O(N (F + M) + N F M / 64) memory. ``chunk_size`` is
    ignored: the chunk is the kernels' tile, 64 positions.
    """
    launch.require_causal(causal)
    if v.size == 0:                                          # N = 0, M = 0 or no heads
        return v.copy()
    out, _, _, _ = _forward(*(rows(x) for x in (phi_q, phi_k, v)), eps)
    return out.reshape(v.shape)


def attend_backward(dout, phi_q, phi_k, v, *, causal, eps, chunk_size=None):
    """Backward of ``attend``: (dphi_q, dphi_k, dv), Eq. (13)-(15) with the normaliser.

    With out = num / den: dnum = dout / den and dden = -dout . out / den, the gradients of the
    numerator and the normaliser; the kernels carry both back through the chunked scan.
    Cost: about three times ``attend``.
    """
    launch.require_causal(causal)
    xp = launch.array_module(v)
    if v.size == 0:
        return xp.zeros_like(phi_q), xp.zeros_like(phi_k), v.copy()
    q, k, v3, do = (rows(x) for x in (phi_q, phi_k, v, dout))
    h, n, f = q.shape
    m = v3.shape[-1]
    out, den, s, z = _forward(q, k, v3, eps)                 # recomputed, not stored
    dnum = do / den[..., None]                                # (H, N, M)
    dden = -(do * out).sum(axis=-1) / den                     # (H, N)
    g, gz = _states(q, dnum, dden, reverse=True)              # G_c, g_c
    dq, dk, dv = xp.empty_like(q), xp.empty_like(k), xp.empty_like(v3)
    nc = math.ceil(n / launch.TILE)
    launch.launch("causal_product.cu", "chunk_backward_qk", (h * nc, math.ceil(f / launch.TILE)),
                  (q, k, v3, dnum, dden, s, z, g, gz, dq, dk, n, f, m))
    launch.launch("causal_product.cu", "chunk_backward_v", (h * nc, math.ceil(m / launch.TILE)),
                  (q, k, dnum, g, dv, n, f, m))
    return dq.reshape(phi_q.shape), dk.reshape(phi_k.shape), dv.reshape(v.shape)
