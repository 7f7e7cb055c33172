"""Reformer (LSH) attention, the NumPy reference: shared-QK softmax attention inside chunks
of positions sorted by a locality-sensitive hash (Kitaev, Kaiser and Levskaya, 2020,
"Reformer: The Efficient Transformer", arXiv:2001.04451, section 2), the second baseline
of Katharopoulos et al. (2020), arXiv:2006.16236, section 4.

The semantics, every choice in one place:

- shared QK: the queries are the rows qk_i, the keys their unit vectors
  k_j = qk_j / ||qk_j|| (a zero row gives k_j = 0), the logits l_ij = qk_i . k_j / sqrt(D).
- hash: h(x) = argmax([x R, -x R]) over n_buckets entries, R (D, n_buckets / 2) standard
  normal, one per round, all drawn by ``numpy.random.default_rng(seed)``; every leading
  index (batch, head) shares the rotations. The unit keys are hashed.
- n_buckets: None means 2 ceil(N / chunk_size), at least 2: the Reformer's 2 N / chunk_size
  rounded up to an even number, so a bucket holds about half a chunk.
- sort and chunk: in each round positions are sorted by (bucket, position) (a stable
  argsort of the buckets) and cut into chunks of ``chunk_size`` sorted positions; the last
  chunk is shorter when chunk_size does not divide N (nothing is asked of the caller).
- window: a query sees every key of its own chunk and of the chunk before it, whatever
  their buckets (as the Reformer does). The first chunk sees itself only: the Reformer wraps
  around to the last chunk, we do not.
- causal: keys j > i are hidden.  Self: i never sees itself, unless it sees no other key
  in any round; then it sees only itself.
- rounds: with n_hashes rounds, a pair that meets in c_ij rounds gets the logit
  l_ij - log c_ij in each, so combining the rounds by their log-sum-exps,
      out_i = sum_r exp(lse_ri - logsumexp_r lse_ri) out_ri,
  gives exactly softmax attention restricted to the union of the rounds' windows, the
  boolean matrix ``mask`` returns. That dense, masked softmax is the oracle of this module.
- key padding (``key_mask`` (..., N), True for a real position): with shared QK a padded
  position is a padded key, and a padded query too. Its row of qk and of v is replaced by 0
  (``drop_padded``, a ``where``: it may hold NaN) and it is hashed to a bucket of its own,
  n_buckets, past every real one, so each round sorts it after the real positions: the
  first L sorted positions are the L real ones, in the order they would have alone, and
  chunks of real positions are as unpadded (the last real chunk may end in padding). No
  real query sees a padded key (its logit is -inf in every round, so in the rounds'
  combination too), a real query counts only real keys towards "sees another key", so it
  still sees at least itself; a padded query sees nothing and its output is 0. So a padded
  batch gives each sequence, at its real positions, what it gives alone, as long as the
  bucket count is the same (n_buckets given, or the default of the padded width N: the
  rotations' shape follows it), and padded positions get exactly 0 output and gradients.

Shapes: qk (..., N, D), v (..., N, M). Cost per round: O(N D n_buckets) to hash,
O(N log N) to sort, O(N C (D + M + n_hashes)) to attend with C = chunk_size; memory
O(N (D + M) + N C), no N x N array outside ``mask``.
"""
from typing import NamedTuple

import numpy as np

SUPPORTS = frozenset({"non_causal", "key_mask"})  # options taken by keyword (dispatch)


class Hashing(NamedTuple):
    """Where every position lands, round by round.

    order : ndarray of int, shape (n_hashes, ..., N)
        The positions sorted by (bucket, position), one round per row; padded positions,
        in bucket n_buckets, come last.
    rank : ndarray of int, shape (n_hashes, ..., N)
        The inverse permutation: where each position sits in ``order``; its chunk is
        rank // chunk_size.
    has_other : ndarray of bool, shape (..., N)
        Whether position i sees a key other than itself in some round (padded: False).
    length : ndarray of int, shape (...)
        L, the real positions of each sequence: the first L of every round's ``order``
        (N without a key mask).
    """

    order: np.ndarray
    rank: np.ndarray
    has_other: np.ndarray
    length: np.ndarray


def default_n_buckets(n, chunk_size):
    """The Reformer's bucket count 2 N / chunk_size, rounded up to an even number >= 2."""
    return max(2, 2 * -(-n // chunk_size))


def drop_padded(key_mask, *arrays):
    """The arrays (..., N, W) with the rows of padded positions (``key_mask`` (..., N)
    False) set to 0 by ``where``, so that whatever they held (NaN too) reaches nothing."""
    return tuple(np.where(key_mask[..., None], x, x.dtype.type(0)) for x in arrays)


def unit_keys(qk):
    """The keys k_j = qk_j / ||qk_j|| (..., N, D) and the norms (..., N, 1); a zero row
    keeps k_j = 0 and reports norm 1, so its key gradient passes through unscaled."""
    norm = np.sqrt(np.sum(qk * qk, axis=-1, keepdims=True))
    norm = np.where(norm == 0, qk.dtype.type(1), norm)          # NaN stays NaN
    return qk / norm, norm


def unit_keys_backward(dk, k, norm):
    """dqk from dk through k = qk / ||qk||: (dk - k (k . dk)) / ||qk||, shape (..., N, D)."""
    return (dk - k * np.sum(k * dk, axis=-1, keepdims=True)) / norm


def rotations(d, *, n_hashes, n_buckets, seed):
    """The random rotations R, one (D, n_buckets / 2) standard normal matrix per round,
    shape (n_hashes, D, n_buckets / 2), float64, deterministic in ``seed``."""
    return np.random.default_rng(seed).standard_normal((n_hashes, d, n_buckets // 2))


def buckets(k, rotation):
    """h(k_j) = argmax([k_j R, -k_j R]) for every position: k (..., N, D), R (D, B/2)
    -> (..., N) ints in [0, B). A NaN row lands in the bucket of its first NaN."""
    projected = k @ rotation.astype(k.dtype)                       # (..., N, B/2)
    return np.argmax(np.concatenate([projected, -projected], axis=-1), axis=-1)


def hashing(k, *, n_hashes, chunk_size, n_buckets, causal, seed, key_mask=None):
    """Sort every round's positions by bucket and find who sees another key: a ``Hashing``.

    k : ndarray, shape (..., N, D), the unit keys. n_buckets None: ``default_n_buckets``.
    key_mask : ndarray of bool, shape (..., N), optional: padded positions (False) go to
    bucket n_buckets, after every real one, and count as no key.
    Cost: O(n_hashes N (D n_buckets + log N)) time.
    """
    n, c = k.shape[-2], chunk_size
    if n_buckets is None:
        n_buckets = default_n_buckets(n, c)
    positions = np.arange(n)
    length = np.full(k.shape[:-2], n) if key_mask is None else key_mask.sum(axis=-1)
    real = positions < length[..., None]                  # sorted slot s holds a real position
    orders, ranks, has_other = [], [], np.zeros(k.shape[:-1], dtype=bool)
    for rotation in rotations(k.shape[-1], n_hashes=n_hashes, n_buckets=n_buckets, seed=seed):
        bucket = buckets(k, rotation)                                      # (..., N)
        if key_mask is not None:
            bucket = np.where(key_mask, bucket, n_buckets)  # a bucket of their own, sorted last
        order = np.argsort(bucket, axis=-1, kind="stable")                 # (bucket, position)
        rank = np.argsort(order, axis=-1)                                  # its inverse
        chunk = rank // c
        if causal:
            # i sees another key iff the smallest real position of its window is below i
            low = _chunks(np.where(real, order, n), c, fill=n).min(axis=-1)  # (..., n_chunks)
            low[..., 1:] = np.minimum(low[..., 1:], low[..., :-1])  # with the previous
            has_other |= np.take_along_axis(low, chunk, axis=-1) < positions
        else:
            # i sees another key iff its window holds more than one real position
            size = np.clip(length[..., None] - c * np.arange(-(-n // c)), 0, c)  # per chunk
            window = size + np.concatenate([np.zeros_like(size[..., :1]), size[..., :-1]],
                                           axis=-1)
            has_other |= np.take_along_axis(window, chunk, axis=-1) > 1
        orders.append(order)
        ranks.append(rank)
    if key_mask is not None:
        has_other &= key_mask
    return Hashing(np.stack(orders), np.stack(ranks), has_other, length)


def _chunks(order, c, fill):
    """order (..., N) padded with ``fill`` to a multiple of c, as (..., n_chunks, c)."""
    n = order.shape[-1]
    pad = np.full((*order.shape[:-1], -n % c), fill, dtype=order.dtype)
    return np.concatenate([order, pad], axis=-1).reshape(*order.shape[:-1], -(-n // c), c)


def _pad(x):
    """x (..., N, W) with one row of zeros appended: index N stands for "no position"."""
    return np.concatenate([x, np.zeros((*x.shape[:-2], 1, x.shape[-1]), x.dtype)], axis=-2)


def _gather(x_padded, pos):
    """Rows of x_padded (..., N + 1, W) at positions pos (..., n_chunks, X) -> (..., n_chunks,
    X, W)."""
    flat = pos.reshape(*pos.shape[:-2], pos.shape[-2] * pos.shape[-1], 1)
    rows = np.take_along_axis(x_padded, flat, axis=-2)
    return rows.reshape(*pos.shape, x_padded.shape[-1])


def _unsort(x_sorted, rank):
    """Rows in sorted order (..., n_chunks, c, W) back to positions (..., N, W)."""
    flat = x_sorted.reshape(*x_sorted.shape[:-3], -1, x_sorted.shape[-1])
    return np.take_along_axis(flat, rank[..., None], axis=-2)


def _unsort_keys(x_window, rank):
    """A window's key rows (..., n_chunks, 2c, W), the previous chunk's then its own, added
    back to positions (..., N, W): each key sits in its own chunk and in the next one's."""
    c = x_window.shape[-2] // 2
    by_chunk = x_window[..., c:, :].copy()                 # as its chunk's own keys
    by_chunk[..., :-1, :, :] += x_window[..., 1:, :c, :]   # as the next chunk's previous keys
    return _unsort(by_chunk, rank)


class Round(NamedTuple):
    """One round's chunks: query positions pos_q (..., n_chunks, c), key positions pos_k
    (..., n_chunks, 2c) (N marks padding), the queries q (..., n_chunks, c, D), the keys
    k (..., n_chunks, 2c, D) and the masked, corrected logits (..., n_chunks, c, 2c)."""

    pos_q: np.ndarray
    pos_k: np.ndarray
    q: np.ndarray
    k: np.ndarray
    logits: np.ndarray


def _round(qk_p, k_p, hashes, r, c, causal):
    """Round r's logits l_ij - log c_ij for the pairs its windows allow, -inf elsewhere."""
    n = qk_p.shape[-2] - 1
    real = np.arange(n) < hashes.length[..., None]                     # the first L slots
    order = np.where(real, hashes.order[r], n)                         # padded: no position
    pos_q = _chunks(order, c, fill=n)                                  # (..., n_chunks, c)
    none = np.full_like(pos_q[..., :1, :], n)
    pos_k = np.concatenate([np.concatenate([none, pos_q[..., :-1, :]], axis=-2), pos_q],
                           axis=-1)                                    # previous chunk, own
    q, k = _gather(qk_p, pos_q), _gather(k_p, pos_k)
    scale = q.dtype.type(q.shape[-1] ** -0.5)
    logits = (q @ k.swapaxes(-1, -2)) * scale                          # l_ij = qk_i . k_j / sqrt(D)
    i, j = pos_q[..., :, None], pos_k[..., None, :]                    # (..., n_chunks, c, 2c)
    other = _gather(_pad(hashes.has_other[..., None]), pos_q)           # (..., n_chunks, c, 1)
    allowed = (i < n) & (j < n) & ((j != i) | ~other)                  # self only as a fallback
    if causal:
        allowed &= j <= i
    if len(hashes.order) > 1:
        logits = logits - np.log(_meetings(hashes.rank // c, pos_q, pos_k)).astype(q.dtype)
    return Round(pos_q, pos_k, q, k, np.where(allowed, logits, -np.inf))


def _meetings(chunk, pos_q, pos_k):
    """c_ij: in how many rounds key j lies in query i's window (its chunk or the one before),
    for the pairs of pos_q x pos_k, at least 1 (padding included). chunk (H, ..., N)."""
    count = np.zeros((*pos_q.shape, pos_k.shape[-1]), dtype=np.int64)
    for ch in chunk:
        ch = np.concatenate([ch, np.zeros_like(ch[..., :1])], axis=-1)  # padding: chunk 0
        ci = np.take_along_axis(ch, pos_q.reshape(*ch.shape[:-1], -1), -1).reshape(pos_q.shape)
        cj = np.take_along_axis(ch, pos_k.reshape(*ch.shape[:-1], -1), -1).reshape(pos_k.shape)
        gap = ci[..., :, None] - cj[..., None, :]
        count += (gap == 0) | (gap == 1)
    return np.maximum(count, 1)


def _forward(qk, k, v, hashes, c, causal):
    """(out (..., N, M), lse (..., N)): the rounds combined one at a time by log-sum-exp."""
    qk_p, k_p, v_p = _pad(qk), _pad(k), _pad(v)
    out, lse = np.zeros_like(v), np.full(v.shape[:-1], -np.inf, dtype=v.dtype)
    for r in range(len(hashes.order)):
        rnd = _round(qk_p, k_p, hashes, r, c, causal)
        top = rnd.logits.max(axis=-1, keepdims=True)     # -inf: no key this round; NaN stays
        top = np.where(top == -np.inf, 0, top)
        p = np.exp(rnd.logits - top)                     # overflow-free, 0 where hidden
        total = p.sum(axis=-1)                           # (..., n_chunks, c)
        out_s = (p @ _gather(v_p, rnd.pos_k)) / np.where(total == 0, 1, total)[..., None]
        with np.errstate(divide="ignore"):               # log 0 = -inf: an empty row
            lse_s = top[..., 0] + np.log(total)
        out_r = _unsort(out_s, hashes.rank[r])
        lse_r = _unsort(lse_s[..., None], hashes.rank[r])[..., 0]
        # out = sum_r exp(lse_r - logsumexp(lse)) out_r, accumulated round by round
        with np.errstate(invalid="ignore"):              # a NaN row stays NaN, quietly
            new = np.logaddexp(lse, lse_r)
        shift = np.where(new == -np.inf, 0, new)[..., None]       # -inf: no key so far
        out = np.exp(lse[..., None] - shift) * out + np.exp(lse_r[..., None] - shift) * out_r
        lse = new
    return out, lse


def attend(qk, v, *, n_hashes, chunk_size, n_buckets, causal, seed, key_mask=None):
    """LSH attention: out_i = sum_j P_ij v_j, P = softmax of l_ij = qk_i . k_j / sqrt(D)
    over the keys j that ``mask`` allows for i.

    Parameters
    ----------
    qk : ndarray, shape (..., N, D)
    v : ndarray, shape (..., N, M)
    n_hashes, chunk_size, n_buckets, causal, seed
        As in the module docstring.
    key_mask : ndarray of bool, shape (..., N), optional
        True for a real position; a padded one is no key to anyone and its output is 0.

    Returns
    -------
    out : ndarray, shape (..., N, M)

    Cost: O(n_hashes N (D n_buckets + log N + C (D + M + n_hashes))) time,
    O(N (D + M) + N C) memory.
    """
    if qk.shape[-2] == 0:
        return np.zeros(v.shape, dtype=v.dtype)
    if key_mask is not None:
        qk, v = drop_padded(key_mask, qk, v)
    k, _ = unit_keys(qk)
    hashes = hashing(k, n_hashes=n_hashes, chunk_size=chunk_size, n_buckets=n_buckets,
                     causal=causal, seed=seed, key_mask=key_mask)
    return _forward(qk, k, v, hashes, chunk_size, causal)[0]


def attend_backward(dout, qk, v, *, n_hashes, chunk_size, n_buckets, causal, seed,
                    key_mask=None):
    """Gradients (dqk (..., N, D), dv (..., N, M)) of ``attend``; the hash is piecewise
    constant, so no gradient flows through it. With ``key_mask``, dout at padded positions
    is not read, and dqk, dv there are exactly 0 (their rows were replaced by 0, and no
    query sees them).

    With L_i the final log-sum-exp and P^r_ij = exp(l_ij - log c_ij - L_i) round r's share of
    P_ij (the shares add up to P_ij):  dv_j = sum_r sum_i P^r_ij dout_i,
    dl_ij = P^r_ij (dout_i . v_j - dout_i . out_i) / sqrt(D),  dqk_i += sum_j dl_ij k_j,
    dk_j = sum_i dl_ij qk_i, then dqk_j += (dk_j - k_j (k_j . dk_j)) / ||qk_j||.
    Cost: the forward's, about three times over.
    """
    if qk.shape[-2] == 0:
        return np.zeros(qk.shape, dtype=qk.dtype), np.zeros(v.shape, dtype=v.dtype)
    if key_mask is not None:
        qk, v, dout = drop_padded(key_mask, qk, v, dout)
    k, norm = unit_keys(qk)
    hashes = hashing(k, n_hashes=n_hashes, chunk_size=chunk_size, n_buckets=n_buckets,
                     causal=causal, seed=seed, key_mask=key_mask)
    out, lse = _forward(qk, k, v, hashes, chunk_size, causal)
    delta = np.sum(dout * out, axis=-1, keepdims=True)         # rowsum(dP * P) = dout_i . out_i
    qk_p, k_p, v_p, dout_p = _pad(qk), _pad(k), _pad(v), _pad(dout)
    lse_p, delta_p = _pad(lse[..., None]), _pad(delta)
    dq, dk, dv = np.zeros_like(qk), np.zeros_like(qk), np.zeros_like(v)
    for r in range(n_hashes):
        rnd = _round(qk_p, k_p, hashes, r, chunk_size, causal)
        p = np.exp(rnd.logits - _gather(lse_p, rnd.pos_q))      # P^r_ij, 0 where hidden
        dout_q = _gather(dout_p, rnd.pos_q)                     # (..., n_chunks, c, M)
        dv += _unsort_keys(p.swapaxes(-1, -2) @ dout_q, hashes.rank[r])   # P^T dout
        dp = dout_q @ _gather(v_p, rnd.pos_k).swapaxes(-1, -2)  # dP_ij = dout_i . v_j
        dl = p * (dp - _gather(delta_p, rnd.pos_q)) * qk.dtype.type(qk.shape[-1] ** -0.5)
        dq += _unsort(dl @ rnd.k, hashes.rank[r])               # the query side
        dk += _unsort_keys(dl.swapaxes(-1, -2) @ rnd.q, hashes.rank[r])   # the key side
    return dq + unit_keys_backward(dk, k, norm), dv


def mask(qk, *, n_hashes, chunk_size, n_buckets, causal, seed, key_mask=None):
    """Which keys each query sees: (..., N, N) bool, the union over rounds of each query's
    window (own chunk and the previous one), causal j <= i, and i itself only when it sees
    nothing else. With ``key_mask`` (..., N), rows and columns of padded positions are
    False: no query sees a padded key, a padded query sees nothing, and a real query that
    sees no other real key sees itself. Dense, O(n_hashes N^2) memory: for tests and
    teaching."""
    n = qk.shape[-2]
    if key_mask is not None:
        qk, = drop_padded(key_mask, qk)
    k, _ = unit_keys(qk)
    hashes = hashing(k, n_hashes=n_hashes, chunk_size=chunk_size, n_buckets=n_buckets,
                     causal=causal, seed=seed, key_mask=key_mask)
    chunk = hashes.rank // chunk_size                            # (H, ..., N)
    gap = chunk[..., :, None] - chunk[..., None, :]              # chunk of i minus chunk of j
    sees = ((gap == 0) | (gap == 1)).any(axis=0)                 # (..., N, N)
    eye = np.eye(n, dtype=bool)
    other = sees & ~eye
    if causal:
        other &= np.tril(np.ones((n, n), dtype=bool))
    if key_mask is not None:
        other &= key_mask[..., :, None] & key_mask[..., None, :]  # real queries, real keys
    alone = ~other.any(axis=-1, keepdims=True)                   # (..., N, 1)
    if key_mask is not None:
        alone &= key_mask[..., :, None]                          # a padded query: nothing
    return other | (eye & alone)
