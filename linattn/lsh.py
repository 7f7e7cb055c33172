"""Reformer (LSH) attention, the second baseline of Katharopoulos et al. (2020),
arXiv:2006.16236, section 4: shared-QK softmax attention inside chunks of positions sorted
by a locality-sensitive hash (Kitaev, Kaiser and Levskaya, 2020, "Reformer: The Efficient
Transformer", arXiv:2001.04451, section 2).

In short: keys are the unit queries k_j = qk_j / ||qk_j||; each round hashes them with a
random rotation R, h(x) = argmax([xR, -xR]); positions are sorted by (bucket, position) and
cut into chunks of ``chunk_size``; a query sees its own chunk and the previous one (the
first chunk only itself), never itself unless it sees nothing else, and with ``causal``
no later key. Rounds are combined so that the result is exactly softmax attention with
logits qk_i . k_j / sqrt(D) restricted to ``lsh_attention_mask``: that dense, masked softmax
is the oracle. Every choice is spelled out in ``linattn.forms.lsh``, the NumPy reference;
``backend="numba"`` runs ``linattn.numba_cpu.lsh``.

Key padding (``key_mask`` or ``key_lengths``): with shared QK a padded position is a padded
key and a padded query. It is hashed to a bucket of its own, sorted after every real
position, so the real positions are chunked as they would be alone; no real query sees it,
its output is 0, and the gradients reaching its qk and v are exactly 0.
"""
import numpy as np

from . import dispatch
from ._checks import check_key_mask, check_lsh
from .forms import lsh as forms_lsh


def lsh_attention(qk, v, *, n_hashes=1, chunk_size=32, n_buckets=None, causal=False, seed=0,
                  backend="auto", key_mask=None, key_lengths=None):
    """Reformer (LSH) attention with shared queries and keys.

    out_i = sum_j P_ij v_j, P_ij = softmax_j(qk_i . k_j / sqrt(D)) over the keys j that
    ``lsh_attention_mask`` allows for query i, k_j = qk_j / ||qk_j||.

    Parameters
    ----------
    qk : ndarray, shape (..., N, D)
        The shared queries and keys (before normalisation).
    v : ndarray, shape (..., N, M)
    n_hashes : int
        Hash rounds; each adds the windows of a fresh random rotation.
    chunk_size : int
        C, positions per chunk; a query sees at most 2 C keys per round.
    n_buckets : int, optional
        Even; default 2 ceil(N / C) (the Reformer's 2 N / C), at least 2.
    causal : bool
        Hide keys j > i.
    seed : int
        Seed of the rotations: the same seed gives the same buckets.
    backend : {"auto", "numpy", "numba"}
        "auto" is "numba" when numba imports, else "numpy"; there is no "cupy" kernel.
    key_mask : ndarray of bool, shape broadcasting to (..., N), optional
        True for a real position. With shared QK a padded position is a padded key and a
        padded query: it is hashed to a bucket of its own, after every real one, so each
        round sorts the real positions first, in the order they have alone; no real query
        sees it (its logit is -inf in every chunk and round); its own output is 0. A real
        query always sees a real key (itself, when no other), so every row is finite, a
        sequence with no real position included (all 0). At its real positions a padded
        sequence gets what it gets alone with the same bucket count: give ``n_buckets``,
        since the default follows the padded width N.
    key_lengths : ndarray of int, shape broadcasting to the leading axes, optional
        The number of real positions of each sequence, padded on the right; instead of
        key_mask.

    Returns
    -------
    out : ndarray, shape (..., N, M), in the inputs' dtype (float16 is computed in float32).

    Cost: O(n_hashes N (D n_buckets + log N + C (D + M + n_hashes))) time, O(N (D + M + C))
    memory on NumPy and O(N (D + M)) on Numba.
    """
    options = dict(n_hashes=n_hashes, chunk_size=chunk_size, n_buckets=n_buckets,
                   causal=causal, seed=seed)
    (qk, v), out_dtype = check_lsh(qk, v, **options)
    kernel, kw = _kernel(qk, backend, options, key_mask, key_lengths)
    return kernel.attend(qk, v, **kw).astype(out_dtype, copy=False)


def lsh_attention_backward(dout, qk, v, *, n_hashes=1, chunk_size=32, n_buckets=None,
                           causal=False, seed=0, backend="auto", key_mask=None,
                           key_lengths=None):
    """Gradients of ``lsh_attention``. The hash is piecewise constant: no gradient flows
    through it, so these are the gradients of the masked softmax attention it equals.

    With P the masked softmax and out = P v:
    dv = P^T dout,  dL = P * (dout v^T - rowsum(dout * out)) / sqrt(D),
    dqk = dL k + J^T (dL^T qk),  J^T x = (x - k (k . x)) / ||qk|| row by row
    (the key side through k = qk / ||qk||), computed chunk by chunk, never as N x N.

    Parameters
    ----------
    dout : ndarray, shape (..., N, M)
        Its rows at padded positions are not read.
    qk, v, n_hashes, chunk_size, n_buckets, causal, seed, backend, key_mask, key_lengths
        As given to ``lsh_attention``. dqk and dv are exactly 0 at padded positions,
        whatever they hold (NaN included).

    Returns
    -------
    dqk : ndarray, shape (..., N, D)
    dv : ndarray, shape (..., N, M)

    Cost: about three forwards.
    """
    options = dict(n_hashes=n_hashes, chunk_size=chunk_size, n_buckets=n_buckets,
                   causal=causal, seed=seed)
    (qk, v, dout), out_dtype = check_lsh(qk, v, dout, **options)
    kernel, kw = _kernel(qk, backend, options, key_mask, key_lengths)
    return tuple(g.astype(out_dtype, copy=False)
                 for g in kernel.attend_backward(dout, qk, v, **kw))


def _kernel(qk, backend, options, key_mask, key_lengths):
    """The key mask checked and the backend module chosen, for both directions: (the module,
    its keyword options, the key mask only when one is given)."""
    mask = check_key_mask(key_mask, key_lengths, qk.shape[:-2], qk.shape[-2], np)
    needs = dispatch.needed(causal=options["causal"], key_mask=mask)
    kernel, _ = dispatch.kernel("lsh", "auto", backend, np, needs=needs)
    return kernel, dict(options, **dispatch.given(key_mask=mask))


def lsh_attention_mask(qk, *, n_hashes=1, chunk_size=32, n_buckets=None, causal=False,
                       seed=0, key_mask=None, key_lengths=None):
    """Which keys each query of ``lsh_attention`` sees, as a dense boolean matrix.

    mask[..., i, j] is True iff, in some round, j lies in i's chunk or the chunk before it,
    j <= i when causal, and j != i unless i sees no other key (then only mask[i, i]). With
    a key mask, i and j must both be real: a padded position's row and column are False,
    and "no other key" means no other real key.

    Parameters
    ----------
    qk, n_hashes, chunk_size, n_buckets, causal, seed, key_mask, key_lengths
        As given to ``lsh_attention``.

    Returns
    -------
    mask : ndarray of bool, shape (..., N, N)

    Cost: O(n_hashes N^2) time and memory: for tests, teaching and plots.
    """
    options = dict(n_hashes=n_hashes, chunk_size=chunk_size, n_buckets=n_buckets,
                   causal=causal, seed=seed)
    (qk,), _ = check_lsh(qk, **options)
    mask = check_key_mask(key_mask, key_lengths, qk.shape[:-2], qk.shape[-2], np)
    return forms_lsh.mask(qk, **options, **dispatch.given(key_mask=mask))
