"""Checks of notebook 10's exercises, CTC (Graves et al., 2006), the loss of section 4.3 of
Katharopoulos et al. (2020), arXiv:2006.16236.

1. ``fn(T, L)``: how many alignments of T frames collapse to L labels, no two neighbours
   equal.
2. ``fn(target)``: the fewest frames an alignment of ``target`` needs.
3. ``fn(log_p, target)``: -log p(target | x) by the forward recursion in log space.

``check_exercise_N(answer)`` prints "Exercise N: correct", raises AssertionError saying what
is wrong, or says the answer is not attempted yet while it raises NotImplementedError.
"""
import itertools

import numpy as np

from linattn.model.speech import ctc

from ._exercises import report


def _collapse(path, blank=0):
    merged = [c for i, c in enumerate(path) if i == 0 or c != path[i - 1]]
    return [c for c in merged if c != blank]


def _count(fn):
    for labels in (1, 2, 3):
        target = list(range(1, labels + 1))
        for frames in range(1, 7):
            want = sum(_collapse(p) == target
                       for p in itertools.product(range(labels + 1), repeat=frames))
            got = fn(frames, labels)
            assert got == want, f"T = {frames}, L = {labels}: {want} alignments, got {got}"


def check_exercise_1(fn):
    report(1, _count, fn)


def _min_frames(fn):
    for target in ([1], [1, 2], [1, 1], [1, 1, 1], [3, 1, 1, 2, 2, 2, 5], [2, 1, 2]):
        want = next(t for t in range(1, 3 * len(target) + 1)
                    if any(_collapse(p) == target
                           for p in itertools.product([0, *sorted(set(target))], repeat=t)))
        got = fn(target)
        assert got == want, f"target {target}: at least {want} frames, got {got}"


def check_exercise_2(fn):
    report(2, _min_frames, fn)


def _log_space(fn):
    rng = np.random.default_rng(5)
    frames, classes = 50, 4
    for target in ([1, 2], [1, 1, 3], [2, 3, 1, 3, 3, 2]):
        logits = 30 * rng.standard_normal((frames, classes))
        log_p = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
        want = ctc.ctc_loss(logits[None], [frames], np.array([target]), [len(target)])[0]
        got = float(fn(log_p, target))
        assert np.isfinite(got), (f"target {target}: -log p = {want:.3f}, got {got}: "
                                  "a probability underflowed; add in log space")
        np.testing.assert_allclose(got, want, rtol=1e-9, err_msg=f"target {target}")


def check_exercise_3(fn):
    report(3, _log_space, fn)
