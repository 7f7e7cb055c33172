"""``method="quadratic"`` on the Numba backend: linear attention through the (masked) kernel
matrix A = phi(Q) phi(K)^T, the left side of Eq. (6) (Eq. 4 non-causal, Eq. 8 causal) of
Katharopoulos et al. (2020), arXiv:2006.16236, a block of query rows at a time.

For a block of C queries, i in [i0, i1), and the keys it sees, j < j1 (j1 = i1 causal, every
key otherwise):
    A = phi_q phi_k^T  (C, j1),  zero where j > i if causal          Eq. (4) / (8)
    out_i = sum_j A_ij v_j / den_i,   den_i = sum_j A_ij + eps.
Backward, with dnum = dout / den and dden_i = -dout_i . out_i / den_i:
    dA = dnum v^T + dden (masked as A),   dphi_q = dA phi_k,
    dphi_k += dA^T phi_q,                 dv += A^T dnum.
Every product is one BLAS call on the block (``blas.gemm``), and the blocks never hold more
than C x N numbers, not the N x N matrix; causal, the keys after a block are never touched,
which halves the work. Its cost, O(N^2 (F + M)) against the blocked kernel's
O(N F M + N C (F + M)) (``chunked``), is the cheaper one for short sequences and wide heads;
``dispatch.AUTO_METHOD`` holds the measured crossover. With ``elu`` the kernels take raw q
and k and apply elu+1 (Eq. 7) as they load them, and its derivative to the gradients.
Inputs may have any strides (a block's rows are copied into a contiguous array as they are
loaded), so heads split from one projection are read in place.
Key padding and states (``padding``): padded keys' raw k are -inf (elu+1 gives 0) or their
features 0, their values 0, before the kernels. A state (S0, z0) handed over adds
phi_q S0 to each block's numerator and phi_q z0 to its normaliser (Eq. 20); backward,
dphi_q += dnum S0^T + dden z0^T, dS0 = sum phi_q^T dnum, dz0 = sum phi_q^T dden. The final
state is S0 + phi_k^T v, z0 + phi_k^T 1 per row; its gradient (dS, dz) adds v dS^T + dz to
dphi_k and phi_k dS to dv, and itself to (dS0, dz0).
Oracle: ``forms.quadratic`` (NumPy), the same matrix made whole.
"""
import numpy as np
from numba import njit, prange

from . import elu as elu_map
from .blas import gemm
from .chunked import SINGLE_THREAD_PRODUCT
from .padding import drop_padded, zero_padded
from ..forms.normaliser import stacked, unstacked
from ..feature_maps import EluPlusOne

FUSED_FEATURE_MAPS = (EluPlusOne,)  # applied by the kernel itself to raw q, k (elu=True)
# options taken by keyword (dispatch)
SUPPORTS = frozenset({"non_causal", "key_mask", "initial_state", "return_state"})
# query rows per block: 16 to 64 timed alike on the copy task's shape (N = 127), larger
# blocks slower (and over SINGLE_THREAD_PRODUCT at D = M = 64, see ``block_length``)
DEFAULT_BLOCK = 32


def block_length(n_keys, d, m, block=DEFAULT_BLOCK):
    """Query rows per block: ``block``, or fewer for long rows, so that each product
    (C x N x max(D, M)) stays on the calling thread (see ``chunked.SINGLE_THREAD_PRODUCT``)."""
    c = block
    while c > 1 and c * n_keys * max(d, m) >= SINGLE_THREAD_PRODUCT:
        c //= 2
    return c


@njit(cache=True, error_model="numpy")
def _scores(phi_q, phi_k, causal, i0):
    """A = phi_q phi_k^T (C, J), and with ``causal`` zero where key j comes after query
    i0 + i (assigned, not multiplied: 0 * NaN would be NaN)."""
    c, n = phi_q.shape[0], phi_k.shape[0]
    a = np.empty((c, n), dtype=phi_q.dtype)
    gemm(phi_q, phi_k.T, a, 0)
    if causal:
        zero = a.dtype.type(0)
        for i in range(c):
            for j in range(i0 + i + 1, n):
                a[i, j] = zero
    return a


@njit(cache=True, error_model="numpy")
def _normalise(a, num, eps, extra):
    """den_i = sum_j A_ij + extra_i + eps (C,); num /= den row by row, in place: num becomes
    out. ``extra`` (C,) is phi_q_i . z0 with a state handed over, else empty."""
    den = np.empty(a.shape[0], dtype=a.dtype)
    for i in range(a.shape[0]):
        s = eps if extra.size == 0 else eps + extra[i]
        for j in range(a.shape[1]):
            s += a[i, j]                                   # Eq. (4): the normaliser
        den[i] = s
        for m in range(num.shape[1]):
            num[i, m] /= s
    return den


@njit(cache=True, error_model="numpy")
def _rows(x, a, b, i0, i1):
    """x[a, b, i0:i1] copied into a C-contiguous (C, W) array, as BLAS takes it, whatever
    x's strides."""
    rows = x[a, b, i0:i1]
    block = np.empty(rows.shape, dtype=x.dtype)
    for i in range(rows.shape[0]):
        for f in range(rows.shape[1]):
            block[i, f] = rows[i, f]
    return block


@njit(cache=True, error_model="numpy")
def _features(raw, elu):
    """phi(raw) (Eq. 7) in a new array if ``elu``, else raw itself. (A separate output: a
    loop writing into the array it reads does not vectorise.)"""
    if not elu:
        return raw
    phi = np.empty_like(raw)
    elu_map.phi_into(raw.reshape(raw.size), phi.reshape(phi.size))
    return phi


@njit(cache=True, error_model="numpy")
def _chain_elu(grad, phi, elu):
    """With ``elu``, grad *= d phi / dx in place (``elu.dphi_from_phi``): the gradient with
    respect to the features becomes that to the raw rows."""
    if not elu:
        return
    for i in range(grad.shape[0]):
        for f in range(grad.shape[1]):
            grad[i, f] *= elu_map.dphi_from_phi(phi[i, f])


@njit(cache=True, error_model="numpy")
def _state_of_row(s1, a, b, m):
    """(S (F, M), z (F,)), C-contiguous, of row (a, b) of [S, z] (A, B, F, M + 1); (0, 0) and
    (0,) arrays when s1 is empty (no state)."""
    if s1.shape[0] == 0:
        return np.empty((0, 0), dtype=s1.dtype), np.empty(0, dtype=s1.dtype)
    return np.ascontiguousarray(s1[a, b, :, :m]), s1[a, b, :, m].copy()


@njit(cache=True, error_model="numpy")
def _state_dots(phi_q, z0):
    """phi_q_i . z0 (C,): the state's share of each normaliser, Eq. (20)."""
    extra = np.zeros(phi_q.shape[0], dtype=phi_q.dtype)
    for i in range(phi_q.shape[0]):
        for f in range(phi_q.shape[1]):
            extra[i] += phi_q[i, f] * z0[f]
    return extra


@njit(parallel=True, cache=True, error_model="numpy")
def _forward(x_q, x_k, v, causal, eps, elu, block, out, s1, final):
    """out (A, B, Nq, M) for x_q (A, B, Nq, D), x_k (A, B, Nk, D), v (A, B, Nk, M), any
    strides: one row (a, b) (batch x head) per thread at a time, its queries in blocks of
    ``block``. A state handed over, s1 = [S0, z0] (A, B, F, M + 1), joins every readout;
    ``final`` (A, B, F, M + 1) gets [S0 + phi_k^T v, z0 + phi_k^T 1]. Either may be empty
    (0, 0, 0, 0): no state, nothing written."""
    n_q, n_k, lead, m = x_q.shape[2], x_k.shape[2], x_q.shape[1], v.shape[3]
    state = s1.shape[0] > 0
    for r in prange(x_q.shape[0] * lead):
        a, b = np.int64(r) // lead, np.int64(r) % lead    # prange counts unsigned
        phi_k, v_r = _features(_rows(x_k, a, b, 0, n_k), elu), _rows(v, a, b, 0, n_k)
        s0, z0 = _state_of_row(s1, a, b, m)                # (F, M), (F,)
        for i0 in range(0, n_q, block):
            i1 = min(n_q, i0 + block)
            j1 = i1 if causal else n_k                     # the keys the block sees
            out_b = np.zeros((i1 - i0, m), dtype=v.dtype)
            if j1 > 0:                                     # (no keys: 0 / eps)
                phi_q = _features(_rows(x_q, a, b, i0, i1), elu)     # (C, D)
                scores = _scores(phi_q, phi_k[:j1], causal, i0)      # A, (C, j1)
                gemm(scores, v_r[:j1], out_b, 0)           # numerator, (C, M)
                extra = np.empty(0, dtype=v.dtype)
                if state:                                  # Eq. (20): S0 + S_i, z0 + z_i
                    gemm(phi_q, s0, out_b, 1)
                    extra = _state_dots(phi_q, z0)
                _normalise(scores, out_b, eps, extra)
            out[a, b, i0:i1] = out_b
        if final.shape[0] > 0:                             # the state after the last key
            s_n = s0.copy() if state else np.zeros((phi_k.shape[1], m), dtype=v.dtype)
            z_n = z0.copy() if state else np.zeros(phi_k.shape[1], dtype=v.dtype)
            gemm(phi_k.T, v_r, s_n, 1)                     # + phi_k^T v, Eq. (10)
            for j in range(n_k):
                z_n += phi_k[j]                            # + phi_k^T 1, Eq. (11)
            final[a, b, :, :m] = s_n
            final[a, b, :, m] = z_n


@njit(parallel=True, cache=True, error_model="numpy")
def _backward(x_q, x_k, v, dout, causal, eps, elu, block, dq, dk, dv, s1, dfinal, ds1):
    """dq, dk, dv for 4-D arrays as ``_forward``'s (the feature gradients without ``elu``):
    each block of queries writes its dphi_q and adds its share of dphi_k and dv. With a
    state handed over, s1 = [S0, z0], its gradient [dS0, dz0] goes to ``ds1``; ``dfinal``
    = [dS, dz] is the final state's gradient; each (A, B, F, M + 1) or empty."""
    n_q, n_k, lead, m = x_q.shape[2], x_k.shape[2], x_q.shape[1], v.shape[3]
    for r in prange(x_q.shape[0] * lead):
        a, b = np.int64(r) // lead, np.int64(r) % lead
        k_r, v_r = _rows(x_k, a, b, 0, n_k), _rows(v, a, b, 0, n_k)
        phi_k = _features(k_r, elu)
        dk_r, dv_r = np.zeros_like(phi_k), np.zeros_like(v_r)
        s0, z0 = _state_of_row(s1, a, b, m)
        ds0, dz0 = np.zeros_like(s0), np.zeros_like(z0)    # (F, M), (F,) or empty
        for i0 in range(0, n_q, block):
            i1 = min(n_q, i0 + block)
            j1 = i1 if causal else n_k
            dq_b = np.zeros((i1 - i0, x_q.shape[3]), dtype=dq.dtype)
            if j1 > 0:
                q_b = _rows(x_q, a, b, i0, i1)
                phi_q = _features(q_b, elu)
                _block_backward(phi_q, phi_k[:j1], v_r[:j1], _rows(dout, a, b, i0, i1),
                                causal, i0, eps, dq_b, dk_r[:j1], dv_r[:j1], s0, z0, ds0, dz0)
                _chain_elu(dq_b, phi_q, elu)
            dq[a, b, i0:i1] = dq_b
        if dfinal.shape[0] > 0:                            # the final state's gradient
            d_s, d_z = _state_of_row(dfinal, a, b, m)
            gemm(v_r, d_s.T, dk_r, 1)                      # dphi_k_j += dS v_j + dz
            for j in range(n_k):
                dk_r[j] += d_z
            gemm(phi_k, d_s, dv_r, 1)                      # dv_j += dS^T phi_k_j
            if s0.shape[0] > 0:
                ds0 += d_s                                 # S0 reaches the final state
                dz0 += d_z
        _chain_elu(dk_r, phi_k, elu)
        dk[a, b] = dk_r
        dv[a, b] = dv_r
        if ds1.shape[0] > 0:
            ds1[a, b, :, :m] = ds0
            ds1[a, b, :, m] = dz0


@njit(cache=True, error_model="numpy")
def _block_backward(phi_q, phi_k, v, dout, causal, i0, eps, dq, dk, dv, s0, z0, ds0, dz0):
    """One block of queries: dq = dphi_q, and its shares dk += dphi_k, dv += dv; with a state
    (S0 (F, M), z0 (F,), both empty without one), its readouts' share of dS0, dz0 too."""
    state = s0.shape[0] > 0
    scores = _scores(phi_q, phi_k, causal, i0)             # A
    out = np.empty((phi_q.shape[0], v.shape[1]), dtype=v.dtype)
    gemm(scores, v, out, 0)
    extra = np.empty(0, dtype=v.dtype)
    if state:
        gemm(phi_q, s0, out, 1)                            # Eq. (20): + phi_q S0
        extra = _state_dots(phi_q, z0)                     # and phi_q z0
    den = _normalise(scores, out, eps, extra)              # out is now out
    dnum = np.empty_like(out)
    dden = np.empty(out.shape[0], dtype=v.dtype)
    da = np.empty_like(scores)
    for i in range(out.shape[0]):
        dd = v.dtype.type(0)
        for m in range(out.shape[1]):
            dnum[i, m] = dout[i, m] / den[i]               # d out / d num
            dd -= dnum[i, m] * out[i, m]                   # d out / d den
        da[i, :] = dd
        dden[i] = dd
    gemm(dnum, v.T, da, 1)                                 # dA = dnum v^T + dden
    if causal:
        for i in range(out.shape[0]):
            da[i, i0 + i + 1:] = 0                         # A's mask
    gemm(scores.T, dnum, dv, 1)                            # dv += A^T dnum
    gemm(da, phi_k, dq, 0)                                 # dphi_q = dA phi_k
    gemm(da.T, phi_q, dk, 1)                               # dphi_k += dA^T phi_q
    if state:
        gemm(dnum, s0.T, dq, 1)                            # dphi_q += dnum S0^T
        for i in range(out.shape[0]):
            dq[i] += dden[i] * z0                          #   + dden z0^T
        gemm(phi_q.T, dnum, ds0, 1)                        # dS0 += phi_q^T dnum
        for i in range(out.shape[0]):
            dz0 += dden[i] * phi_q[i]                      # dz0 += phi_q^T dden


def _four_d(x):
    """x (..., N, W) as (A, B, N, W): a view for up to two leading axes (the model's batch
    and heads, whatever their strides), merged into A beyond."""
    if x.ndim <= 4:
        return x.reshape((1,) * (4 - x.ndim) + x.shape)
    return x.reshape(-1, *x.shape[-3:])


def _block_length(phi_q, phi_k, v):
    return block_length(phi_k.shape[-2], phi_q.shape[-1], v.shape[-1])


def _stacked(state, dtype):
    """State(S (..., F, M), z (..., F)) -> [S, z] (A, B, F, M + 1), as ``_four_d`` lays out
    the inputs; None -> an empty (0, 0, 0, 0) array."""
    if state is None:
        return np.empty((0, 0, 0, 0), dtype=dtype)
    return _four_d(stacked(state).astype(dtype, copy=False))


def _new_state(phi_q, v, wanted):
    """An uninitialised [S, z] (..., F, M + 1) for the kernels to fill, or None."""
    if not wanted:
        return None
    return np.empty((*v.shape[:-2], phi_q.shape[-1], v.shape[-1] + 1), dtype=v.dtype)


def _four_d_or_empty(s1, dtype):
    return np.empty((0, 0, 0, 0), dtype=dtype) if s1 is None else _four_d(s1)


def attend(phi_q, phi_k, v, *, causal, eps, chunk_size=None, elu=False, key_mask=None,
           initial_state=None, return_state=False):
    """Normalised linear attention, Eq. (4) / (8), by blocks of the kernel matrix.
    Shapes (..., Nq, F), (..., Nk, F), (..., Nk, M) -> (..., Nq, M), any strides (no copies
    up to two leading axes); raw q, k with ``elu``. ``chunk_size`` is ignored. The output
    is laid out as phi_q is (``numpy.empty_like``): heads split from one array merge back
    without a copy. ``key_mask``, ``initial_state`` and ``return_state`` as in
    ``linear_attention`` (with ``return_state``: ``(out, State)``).

    Cost: O(Nq Nk (F + M)) time (half of it causal), O(C Nk) memory per thread.
    """
    phi_k, v = drop_padded(phi_k, v, key_mask, elu)
    out = np.empty_like(phi_q, shape=(*phi_q.shape[:-1], v.shape[-1]), dtype=v.dtype)
    final = _new_state(phi_q, v, return_state)
    _forward(_four_d(phi_q), _four_d(phi_k), _four_d(v), causal, v.dtype.type(eps), elu,
             _block_length(phi_q, phi_k, v), _four_d(out), _stacked(initial_state, v.dtype),
             _four_d_or_empty(final, v.dtype))
    return (out, unstacked(final)) if return_state else out


def attend_backward(dout, phi_q, phi_k, v, *, causal, eps, chunk_size=None, elu=False,
                    key_mask=None, initial_state=None, dstate=None):
    """Backward of ``attend``: (dphi_q, dphi_k, dv), or (dq, dk, dv) with ``elu``, each laid
    out as its input, then State(dS0, dz0) when ``initial_state`` is given; ``dstate`` is
    the final state's gradient. The gradients of padded keys are exactly 0.

    Cost: about 2.5 forwards (five products a block against two), O(C Nk) memory per thread
    beyond the gradients.
    """
    phi_k, v = drop_padded(phi_k, v, key_mask, elu)
    dq, dk, dv = np.empty_like(phi_q), np.empty_like(phi_k), np.empty_like(v)
    ds1 = _new_state(phi_q, v, initial_state is not None)
    _backward(_four_d(phi_q), _four_d(phi_k), _four_d(v), _four_d(dout), causal,
              v.dtype.type(eps), elu, _block_length(phi_q, phi_k, v), _four_d(dq),
              _four_d(dk), _four_d(dv), _stacked(initial_state, v.dtype),
              _stacked(dstate, v.dtype), _four_d_or_empty(ds1, v.dtype))
    dk, dv = zero_padded(key_mask, dk, dv)
    return (dq, dk, dv) if ds1 is None else (dq, dk, dv, unstacked(ds1))
