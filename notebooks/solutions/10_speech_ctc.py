"""Our answers to notebook 10's exercises, CTC (the checks are in
``checks/10_speech_ctc.py``).

1. ``n_alignments``: C(T + L, 2L) alignments of T frames collapse to L labels with no two
   neighbours equal.
2. ``min_frames``: L frames, plus one blank between each pair of equal neighbours.
3. ``ctc_nll``: the forward recursion over the blank-interleaved target, in log space.
"""
import math

import numpy as np


def n_alignments(frames, labels):
    """Exercise 1: an alignment is the L labels in order, each held for at least one frame,
    with L + 1 runs of blanks (possibly empty) around them: choose the 2L boundaries
    among the T + L positions of a stars and bars count, C(T + L, 2L)."""
    return math.comb(frames + labels, 2 * labels)


def min_frames(target):
    """Exercise 2: one frame per label, and a blank between equal neighbours (else they
    merge)."""
    return len(target) + sum(a == b for a, b in zip(target, target[1:]))


def ctc_nll(log_p, target, blank=0):
    """Exercise 3: -log p(target | x) for log_p (T, C), alpha_t(s) kept as logarithms."""
    ext = [blank]
    for label in target:
        ext += [label, blank]
    frames, states = log_p.shape[0], len(ext)
    alpha = np.full(states, -np.inf)
    alpha[0], alpha[1] = log_p[0, ext[0]], log_p[0, ext[1]]
    for t in range(1, frames):
        before = alpha
        alpha = np.full(states, -np.inf)
        for s in range(states):
            terms = [before[s]] + ([before[s - 1]] if s >= 1 else [])
            if s >= 2 and ext[s] != blank and ext[s] != ext[s - 2]:
                terms.append(before[s - 2])              # skip the blank between labels
            alpha[s] = log_p[t, ext[s]] + np.logaddexp.reduce(terms)
    return -np.logaddexp(alpha[-1], alpha[-2])
