"""Connectionist temporal classification (CTC): the loss, its gradient, greedy decoding and
the phoneme error rate of the speech experiment, section 4.3 of Katharopoulos et al. (2020),
arXiv:2006.16236 (CTC itself: Graves et al., ICML 2006, section 4.1).

A model emits, at each of T frames, unnormalised scores over C classes, one of them the
blank. An alignment pi (one class per frame) collapses to a label sequence by merging runs
of a class and dropping blanks: B(a a - b - - b) = (a b b). The loss is
    nll = -log p(l | x) = -log sum_{pi : B(pi) = l} prod_t y_t(pi_t),   y_t = softmax(logits_t).
The sum runs over the extended labels l' = (-, l_1, -, l_2, ..., l_L, -) of length S = 2L + 1
with the forward variables of Graves et al. (section 4.1) in log space,
    alpha_t(s) = y_t(l'_s) [alpha_{t-1}(s) + alpha_{t-1}(s-1) + alpha_{t-1}(s-2)],
where the skip from s-2 is allowed only onto a label that differs from l'_{s-2} (not onto a
blank, nor between equal neighbours: a a needs a blank between), and the backward variables
    beta_t(s) = sum over s' in {s, s+1, s+2 (same rule)} of y_{t+1}(l'_{s'}) beta_{t+1}(s'),
here without the emission at t, so p(l | x) = sum_s alpha_t(s) beta_t(s) at every t. The
gradient through the log-softmax is
    d nll / d logits_t(k) = y_t(k) - gamma_t(k),  gamma_t(k) = sum_{s : l'_s = k}
                                                   alpha_t(s) beta_t(s) / p(l | x).

Everything runs in float64 log space (``np.logaddexp``), so thousands of frames neither
underflow nor give NaN. A label sequence that no alignment can produce (L plus its repeats
longer than T) has p = 0: loss +inf, gradient 0. Frames past an utterance's length get
gradient 0. Vectorised over the batch; one Python loop over time.
Reference: tests/test_model_ctc.py holds the loss and gradient to a brute-force sum over
every alignment and to central finite differences.
"""
import numpy as np

from ... import _checks


# --- input checks: the generic ones from linattn._checks, CTC's own here -----------------

def _int_vector(name, x, size):
    """``x`` as an int64 vector of ``size`` entries, or a clear error."""
    x = np.asarray(x)
    if x.dtype.kind not in "iu" or x.shape != (size,):
        raise ValueError(f"{name} must be an integer array of shape ({size},), got "
                         f"{x.dtype} {x.shape}")
    return x.astype(np.int64)


def check_ctc(logits, input_lengths, labels, label_lengths, blank):
    """Validate the inputs of ``ctc_loss``: logits (B, T, C) float, input_lengths (B,) in
    1..T, labels (B, L_max) integers, label_lengths (B,) in 0..L_max, every counted label in
    0..C-1 and not ``blank``, blank in 0..C-1.

    Returns (logits, input_lengths, labels, label_lengths), the integers as int64.
    """
    logits = _checks.as_float_array("logits", logits)
    if _checks.array_module(logits) is not np:
        raise TypeError("ctc_loss runs on NumPy arrays")
    if logits.ndim != 3 or 0 in logits.shape:
        raise ValueError(f"logits must have shape (B, T, C) with B, T, C >= 1, got "
                         f"{logits.shape}")
    b, t, c = logits.shape
    if isinstance(blank, bool) or not isinstance(blank, (int, np.integer)) or not 0 <= blank < c:
        raise ValueError(f"blank must be a class index in 0..{c - 1}, got {blank!r}")
    input_lengths = _int_vector("input_lengths", input_lengths, b)
    if np.any(input_lengths < 1) or np.any(input_lengths > t):
        raise ValueError(f"input_lengths must lie in 1..T = {t}, got {input_lengths}")
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu" or labels.ndim != 2 or labels.shape[0] != b:
        raise ValueError(f"labels must be an integer array of shape (B, L_max) = ({b}, ...), "
                         f"got {labels.dtype} {labels.shape}")
    labels = labels.astype(np.int64)
    label_lengths = _int_vector("label_lengths", label_lengths, b)
    if np.any(label_lengths < 0) or np.any(label_lengths > labels.shape[1]):
        raise ValueError(f"label_lengths must lie in 0..L_max = {labels.shape[1]}, got "
                         f"{label_lengths}")
    counted = labels[np.arange(labels.shape[1]) < label_lengths[:, None]]
    if counted.size and (counted.min() < 0 or counted.max() >= c or np.any(counted == blank)):
        raise ValueError(f"labels must be classes in 0..{c - 1} other than the blank "
                         f"({blank}), got values in [{counted.min()}, {counted.max()}]"
                         f"{' including the blank' if np.any(counted == blank) else ''}")
    return logits, input_lengths, labels, label_lengths


def _log_softmax(logits):
    """log softmax over the last axis in float64, shifted by the row maximum."""
    x = logits.astype(np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _extended(labels, label_lengths, blank):
    """The extended labels and what the recursions may do on them.

    Returns
    -------
    ext : ndarray of int, shape (B, S), S = 2 L_max + 1
        l' = (blank, l_1, blank, ..., l_L, blank), blank past 2 L_b + 1.
    skip : ndarray of bool, shape (B, S)
        skip[b, s]: the transition s-2 -> s is allowed (l'_s not blank, l'_s != l'_{s-2}).
    real : ndarray of bool, shape (B, S)
        s < 2 L_b + 1: a state of utterance b's own extended labels.
    """
    b, l_max = labels.shape
    counted = np.arange(l_max) < label_lengths[:, None]            # (B, L_max)
    ext = np.full((b, 2 * l_max + 1), blank, dtype=np.int64)
    ext[:, 1::2] = np.where(counted, labels, blank)
    skip = np.zeros(ext.shape, dtype=bool)
    skip[:, 2:] = (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])
    real = np.arange(ext.shape[1]) < 2 * label_lengths[:, None] + 1
    return ext, skip, real


def _shift(x, by):
    """x[..., s - by] along the last axis (by > 0: from the left, by < 0: from the right),
    -inf where that index falls outside."""
    out = np.full_like(x, -np.inf)
    if by > 0:
        out[:, by:] = x[:, :-by]
    else:
        out[:, :by] = x[:, -by:]
    return out


def _final_states(x, label_lengths):
    """log of x(S_b - 1) + x(S_b - 2), the two states an alignment may end in (only the
    last blank when L_b = 0). x (B, S) -> (B,)."""
    rows = np.arange(x.shape[0])
    last = x[rows, 2 * label_lengths]                              # the final blank
    label = np.where(label_lengths > 0, x[rows, np.maximum(2 * label_lengths - 1, 0)], -np.inf)
    return np.logaddexp(last, label)


def _lattice(logits, input_lengths, labels, label_lengths, blank):
    """log alpha, log beta (B, T, S), log p(l | x) (B,), log y (B, T, C) and ext (B, S)."""
    logy = _log_softmax(logits)                                    # (B, T, C)
    ext, skip, real = _extended(labels, label_lengths, blank)
    b, t_max, s_max = logy.shape[0], logy.shape[1], ext.shape[1]
    alive = np.arange(t_max)[None, :] < input_lengths[:, None]     # (B, T)
    # log y_t(l'_s), (B, T, S); -inf past each utterance, so padding is never read
    emit = np.where(alive[:, :, None], np.take_along_axis(logy, ext[:, None, :], axis=2),
                    -np.inf)
    alpha = np.full((b, t_max, s_max), -np.inf)
    beta = np.full((b, t_max, s_max), -np.inf)
    # alpha_1: start in the first blank or on the first label
    a = np.full((b, s_max), -np.inf)
    a[:, :2] = emit[:, 0, :2]
    alpha[:, 0] = np.where(real, a, -np.inf)
    for t in range(1, t_max):
        prev = alpha[:, t - 1]
        # stay on s, advance from s-1, or skip from s-2 where allowed
        came = np.logaddexp(np.logaddexp(prev, _shift(prev, 1)),
                            np.where(skip, _shift(prev, 2), -np.inf))
        alpha[:, t] = np.where(real & alive[:, t, None], came + emit[:, t], -np.inf)
    log_p = _final_states(alpha[np.arange(b), input_lengths - 1], label_lengths)
    # beta_{T_b}: 1 (log 0) on the two final states, each utterance at its own last frame
    end = np.full((b, s_max), -np.inf)
    rows = np.arange(b)
    end[rows, 2 * label_lengths] = 0.0
    end[rows[label_lengths > 0], 2 * label_lengths[label_lengths > 0] - 1] = 0.0
    for t in range(t_max - 1, -1, -1):
        if t < t_max - 1:
            nxt = beta[:, t + 1] + emit[:, t + 1]                  # y_{t+1}(l'_s') beta_{t+1}(s')
            # stay on s, go on to s+1, or skip to s+2 where that skip is allowed
            went = np.logaddexp(np.logaddexp(nxt, _shift(nxt, -1)),
                                _shift(np.where(skip, nxt, -np.inf), -2))
        else:
            went = np.full((b, s_max), -np.inf)
        last = (t == input_lengths - 1)[:, None]
        inside = (t < input_lengths - 1)[:, None]
        beta[:, t] = np.where(real, np.where(last, end, np.where(inside, went, -np.inf)),
                              -np.inf)
    return alpha, beta, log_p, logy, ext


def ctc_loss(logits, input_lengths, labels, label_lengths, *, blank=0):
    """CTC negative log-likelihood of each utterance's labels, -log p(l | x).

    Parameters
    ----------
    logits : ndarray, shape (B, T, C)
        Unnormalised scores (the log-softmax is taken here). Frames t >= input_lengths[b]
        are ignored.
    input_lengths : ndarray of int, shape (B,)
        Frames per utterance, 1..T.
    labels : ndarray of int, shape (B, L_max)
        Label sequences padded to L_max; entries past label_lengths[b] are ignored.
    label_lengths : ndarray of int, shape (B,)
        0..L_max.
    blank : int
        The blank class.

    Returns
    -------
    nll : ndarray, shape (B,), in the logits' dtype; +inf where no alignment of
        input_lengths[b] frames yields the labels.

    Cost: O(B T (C + L_max)) time and O(B T L_max) memory; a Python loop over T.
    """
    logits, input_lengths, labels, label_lengths = check_ctc(
        logits, input_lengths, labels, label_lengths, blank)
    _, _, log_p, _, _ = _lattice(logits, input_lengths, labels, label_lengths, blank)
    return (-log_p).astype(logits.dtype)


def ctc_loss_backward(dnll, logits, input_lengths, labels, label_lengths, *, blank=0):
    """Gradient of ``ctc_loss`` with respect to the (unnormalised) logits.

    dlogits[b, t, k] = dnll[b] (y_t(k) - gamma_t(k)) for t < input_lengths[b], with the
    occupancy gamma_t(k) = sum_{s: l'_s = k} alpha_t(s) beta_t(s) / p(l | x) (Graves et al.,
    section 4.2, through the log-softmax); 0 for later frames and for impossible utterances.

    Parameters
    ----------
    dnll : ndarray, shape (B,)
        Upstream gradient of each utterance's loss.
    logits, input_lengths, labels, label_lengths, blank
        As given to ``ctc_loss``.

    Returns
    -------
    dlogits : ndarray, shape (B, T, C), in the logits' dtype.

    Cost: O(B T C L_max) time (the occupancies summed per class), O(B T L_max) memory.
    """
    return ctc_loss_and_backward(dnll, logits, input_lengths, labels, label_lengths,
                                 blank=blank)[1]


def ctc_loss_and_backward(dnll, logits, input_lengths, labels, label_lengths, *, blank=0):
    """``(ctc_loss(...), ctc_loss_backward(dnll, ...))`` from one forward-backward lattice:
    the same arrays, bit for bit, at the cost of ``ctc_loss_backward`` alone (a training
    step needs both, and its ``dnll`` does not depend on the loss). Arguments as for
    ``ctc_loss_backward``; returns nll (B,) and dlogits (B, T, C), in the logits' dtype."""
    logits, input_lengths, labels, label_lengths = check_ctc(
        logits, input_lengths, labels, label_lengths, blank)
    dnll = _checks.as_float_array("dnll", dnll)
    if dnll.shape != (logits.shape[0],):
        raise ValueError(f"dnll must have shape (B,) = ({logits.shape[0]},), got {dnll.shape}")
    alpha, beta, log_p, logy, ext = _lattice(logits, input_lengths, labels, label_lengths,
                                             blank)
    possible = log_p != -np.inf         # NaN counts as possible: NaN in gives NaN out
    shift = np.where(possible, log_p, 0.0)[:, None, None]
    occupancy = np.exp(alpha + beta - shift)                       # (B, T, S)
    onehot = ext[:, :, None] == np.arange(logits.shape[2])         # (B, S, C)
    gamma = occupancy @ onehot.astype(np.float64)                  # (B, T, C), summed per class
    grad = np.exp(logy) - gamma                                    # y_t(k) - gamma_t(k)
    alive = np.arange(logits.shape[1])[None, :] < input_lengths[:, None]
    keep = alive[:, :, None] & possible[:, None, None]
    dlogits = np.where(keep, grad * dnll.astype(np.float64)[:, None, None], 0.0)
    return (-log_p).astype(logits.dtype), dlogits.astype(logits.dtype)


def greedy_decode(logits, input_lengths, blank=0):
    """Best-path decoding: the argmax class of each frame, runs merged, blanks dropped.

    Parameters
    ----------
    logits : ndarray, shape (B, T, C)
    input_lengths : ndarray of int, shape (B,)
    blank : int

    Returns
    -------
    hyps : list of B lists of int

    Cost: O(B T C).
    """
    logits = _checks.as_float_array("logits", logits)
    if logits.ndim != 3:
        raise ValueError(f"logits must have shape (B, T, C), got {logits.shape}")
    lengths = _int_vector("input_lengths", input_lengths, logits.shape[0])
    if np.any(lengths < 0) or np.any(lengths > logits.shape[1]):
        raise ValueError(f"input_lengths must lie in 0..T = {logits.shape[1]}, got {lengths}")
    best = logits.argmax(axis=-1)                                  # (B, T)
    hyps = []
    for path, n in zip(best, lengths):
        path = path[:n]
        new_run = np.ones(n, dtype=bool)
        new_run[1:] = path[1:] != path[:-1]                        # first frame of each run
        hyps.append([int(k) for k in path[new_run & (path != blank)]])
    return hyps


def edit_distance(a, b):
    """Levenshtein distance: fewest substitutions, insertions and deletions turning a into b.

    Row by row of the dynamic programme d[i, j] = min(d[i-1, j] + 1, d[i-1, j-1] + [a_i !=
    b_j], d[i, j-1] + 1); within a row the insertions chain, d[i, j] = min over k <= j of
    (u_k + j - k), a running minimum of u_k - k. Cost: O(len(a) len(b)), vectorised over b.
    """
    a, b = np.asarray(a).ravel(), np.asarray(b).ravel()
    row = np.arange(len(b) + 1)                                    # d[0, j] = j
    offsets = np.arange(len(b) + 1)
    for i, symbol in enumerate(a, start=1):
        u = np.empty_like(row)
        u[0] = i                                                   # d[i, 0]: delete all
        u[1:] = np.minimum(row[1:] + 1, row[:-1] + (b != symbol))  # delete / substitute
        row = np.minimum.accumulate(u - offsets) + offsets         # then insert
    return int(row[-1])


def phoneme_error_rate(hyps, refs):
    """PER = total edit distance / total reference length over the utterances.

    Parameters
    ----------
    hyps, refs : sequences of label sequences, equally many

    Returns
    -------
    per : float (can exceed 1 with many insertions)
    """
    if len(hyps) != len(refs):
        raise ValueError(f"got {len(hyps)} hypotheses for {len(refs)} references")
    total = sum(len(r) for r in refs)
    if total == 0:
        raise ValueError("the references hold no labels: the error rate is undefined")
    return sum(edit_distance(h, r) for h, r in zip(hyps, refs)) / total
