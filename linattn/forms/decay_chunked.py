"""Decayed and gated causal linear attention in blocks, in log space: ``chunked`` of
Katharopoulos et al. (2020), arXiv:2006.16236, with the gates of ``decay`` (RetNet's scalar
decay, Sun et al. 2023, section 2.1, its chunkwise recurrent form; GLA's gate, Yang et al.
2023, section 4).

For a block of C positions starting after position t0, let c_i = b_i - b_t0 be the log
gates cumulated from the block's start (<= 0), and S_blk the state entering it. Then

    num_i = sum_{j in block, j <= i} sum_f phi_q_if phi_k_jf exp(c_if - c_jf) v_j   (intra)
            + (phi_q_i * exp(c_i))^T S_blk                                         (inter)
    S_next = diag(exp(c_last)) S_blk + sum_{j in block} diag(exp(c_last - c_j)) phi_k_j v_j^T

Every exponent is <= 0: c_i - c_j only for j <= i (masked before the exp), c_i, and
c_last - c_j. So float32 stays finite for any N and any decay (N = 65536 at gamma = 0.5 or
g = -5 is tested); a strong decay only underflows old terms to 0, which is their value.
A Python loop over the N / C blocks carries the state and builds each block's decays in
turn; the products inside a block are batched over the leading axes.
This is ``method="chunked"`` with a decay, a log gate or without the normaliser.
Oracle: ``decay.product``.
"""
from .._checks import array_module
from .chunked import _blocks, _unblocks
from .decay import decays, gated, gated_backward

FUSED_FEATURE_MAPS = ()  # every feature map is applied before the kernel
SUPPORTS = frozenset({"non_causal", "key_mask", "initial_state", "return_state", "decay",
                      "log_gate", "unnormalized"})  # dispatch; gates causal only

DEFAULT_CHUNK_SIZE = 32


def _parts(phi_q, phi_k, v, g, chunk_size):
    """The blocks (..., B, C, F|W) of phi_q, phi_k, v; c (..., B, C, F), the log gates
    cumulated within each block; and exp(c_last - c_j) (..., B, C, F). Padding positions
    have g = 0 and phi_k = v = 0."""
    xp = array_module(v)
    q, k, vb, gb = (_blocks(x, chunk_size) for x in (phi_q, phi_k, v, g))
    c = xp.cumsum(gb, axis=-2)                                   # c_i = b_i - b_t0 <= 0
    to_end = xp.exp(c[..., -1:, :] - c)                          # exp(c_last - c_j) <= 1
    return q, k, vb, c, to_end


def _block(x, blk):
    """Block ``blk`` of x (..., B, C, W): (..., C, W)."""
    return x[..., blk, :, :]


def product(phi_q, phi_k, v, g, s0=None, chunk_size=DEFAULT_CHUNK_SIZE):
    """num (..., N, W) and the final state S_N (..., F, W) of ``decay.product``, in blocks
    of ``chunk_size`` positions. Cost: O(N C (F + W) + N F W) time; memory O(N (F + W)) for
    the blocks, one F x W sum per block (kv, N / C of them) and the intra-block decays E
    (..., C, C, F) of one block at a time."""
    xp = array_module(v)
    n = v.shape[-2]
    q, k, vb, c, to_end = _parts(phi_q, phi_k, v, g, chunk_size)
    kv = (k * to_end).swapaxes(-1, -2) @ vb                      # (..., B, F, W): block's add
    total = xp.exp(c[..., -1, :])                                # (..., B, F): exp(c_last)
    s = (xp.zeros((*v.shape[:-2], phi_k.shape[-1], v.shape[-1]), dtype=v.dtype)
         if s0 is None else s0)
    num = xp.empty_like(vb)                                      # (..., B, C, W)
    for blk in range(kv.shape[-3]):                              # s is S_blk, entering it
        qb, cb = _block(q, blk), _block(c, blk)
        e = decays(cb, cb)                                       # (..., C, C, F)
        a = xp.einsum("...if,...jf,...ijf->...ij", qb, _block(k, blk), e)
        num[..., blk, :, :] = a @ _block(vb, blk) + (qb * xp.exp(cb)) @ s   # intra + inter
        s = total[..., blk, :, None] * s + kv[..., blk, :, :]     # S_next
    return _unblocks(num, n), s


def product_backward(dnum, phi_q, phi_k, v, g, s0=None, dfinal=None,
                     chunk_size=DEFAULT_CHUNK_SIZE):
    """Backward of ``product``: (dphi_q, dphi_k, dv, dS0 or None).

    Intra-block as ``decay.product_backward`` (dA_ij = dnum_i . v_j, weighted by E_ijf).
    With G_blk = dL/dS_next of a block (from the next block, or ``dfinal`` after the last),
    G entering = diag(exp(c_last)) G_blk + sum_i (phi_q_i * exp(c_i)) dnum_i^T (a reverse
    loop over blocks); inter terms: dphi_q_i += exp(c_i) * (S_blk dnum_i),
    dphi_k_j += exp(c_last - c_j) * (G_blk v_j), dv_j += (phi_k_j * exp(c_last - c_j))^T G_blk;
    dS0 is G entering the first block. A forward loop over the blocks (S_blk, the intra
    terms, dphi_q), then a reverse one (G_blk, dphi_k and dv's inter terms): one block's E at
    a time, as ``product``.
    """
    xp = array_module(v)
    n = v.shape[-2]
    q, k, vb, c, to_end = _parts(phi_q, phi_k, v, g, chunk_size)
    do = _blocks(dnum, chunk_size)
    k_end = k * to_end                                           # phi_k_j exp(c_last - c_j)
    kv = k_end.swapaxes(-1, -2) @ vb                             # (..., B, F, W)
    qdo = (q * xp.exp(c)).swapaxes(-1, -2) @ do                  # (..., B, F, W)
    total = xp.exp(c[..., -1, :])                                # (..., B, F)
    shape = (*v.shape[:-2], phi_k.shape[-1], v.shape[-1])
    s = xp.zeros(shape, dtype=v.dtype) if s0 is None else s0
    dq, dk, dv = xp.empty_like(q), xp.empty_like(k), xp.empty_like(vb)
    for blk in range(kv.shape[-3]):                              # forward: S_blk, intra
        qb, kb, vbb, cb, dob = (_block(x, blk) for x in (q, k, vb, c, do))
        e = decays(cb, cb)                                       # (..., C, C, F)
        a = xp.einsum("...if,...jf,...ijf->...ij", qb, kb, e)    # (..., C, C)
        da = dob @ vbb.swapaxes(-1, -2)                          # E masks j > i
        dq[..., blk, :, :] = (xp.einsum("...ij,...jf,...ijf->...if", da, kb, e)
                              + xp.exp(cb) * (dob @ s.swapaxes(-1, -2)))
        dk[..., blk, :, :] = xp.einsum("...ij,...if,...ijf->...jf", da, qb, e)
        dv[..., blk, :, :] = a.swapaxes(-1, -2) @ dob
        s = total[..., blk, :, None] * s + kv[..., blk, :, :]
    adj = xp.zeros(shape, dtype=v.dtype) if dfinal is None else dfinal
    for blk in reversed(range(kv.shape[-3])):                    # backward: adj is G_blk
        dk[..., blk, :, :] += _block(to_end, blk) * (_block(vb, blk) @ adj.swapaxes(-1, -2))
        dv[..., blk, :, :] += _block(k_end, blk) @ adj
        adj = total[..., blk, :, None] * adj + qdo[..., blk, :, :]
    return (_unblocks(dq, n), _unblocks(dk, n), _unblocks(dv, n),
            None if s0 is None else adj)


def attend(phi_q, phi_k, v, *, causal, eps, chunk_size=DEFAULT_CHUNK_SIZE, log_gate=None,
           normalize=True, key_mask=None, initial_state=None, return_state=False):
    """Gated causal linear attention in blocks of ``chunk_size``; arguments and result as
    ``decay.attend``. Cost: O(N C (F + M) + N F M) time."""
    return gated(product, phi_q, phi_k, v, eps=eps, log_gate=log_gate, normalize=normalize,
                 key_mask=key_mask, initial_state=initial_state, return_state=return_state,
                 causal=causal, chunk_size=chunk_size)


def attend_backward(dout, phi_q, phi_k, v, *, causal, eps, chunk_size=DEFAULT_CHUNK_SIZE,
                    log_gate=None, normalize=True, key_mask=None, initial_state=None,
                    dstate=None):
    """Backward of ``attend``: (dphi_q, dphi_k, dv, dlog_gate), and State(dS0, dz0) when
    ``initial_state`` is given."""
    return gated_backward(product, product_backward, dout, phi_q, phi_k, v, eps=eps,
                          log_gate=log_gate, normalize=normalize, key_mask=key_mask,
                          initial_state=initial_state, dstate=dstate, causal=causal,
                          chunk_size=chunk_size)
