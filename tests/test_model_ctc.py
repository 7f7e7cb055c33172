"""CTC: loss and gradient against a brute-force sum over every alignment (float64, rtol
1e-10) and central finite differences; long float32 inputs, impossible alignments, repeated
labels, padding; greedy decoding, edit distance and the phoneme error rate."""
import itertools

import numpy as np
import pytest
from hypothesis import given, strategies as st

from helpers import assert_gradients_match
from linattn.model.speech.ctc import (ctc_loss, ctc_loss_and_backward, ctc_loss_backward,
                                      edit_distance, greedy_decode, phoneme_error_rate)


def _collapse(path, blank):
    merged = [k for i, k in enumerate(path) if i == 0 or k != path[i - 1]]
    return [k for k in merged if k != blank]


def brute_force(logits, label, blank=0):
    """(nll, dlogits) of one utterance, logits (T, C), by enumerating all C^T alignments."""
    t_len, c = logits.shape
    y = np.exp(logits - logits.max(axis=1, keepdims=True))
    y /= y.sum(axis=1, keepdims=True)
    total, gamma = 0.0, np.zeros_like(y)
    for path in itertools.product(range(c), repeat=t_len):
        if _collapse(path, blank) == list(label):
            prob = np.prod(y[np.arange(t_len), path])
            total += prob
            gamma[np.arange(t_len), path] += prob
    if total == 0:
        return np.inf, np.zeros_like(y)
    return -np.log(total), y - gamma / total


@st.composite
def ctc_cases(draw):
    b = draw(st.integers(1, 3))
    t_max, c = draw(st.integers(1, 5)), draw(st.integers(2, 4))
    input_lengths = [draw(st.integers(1, t_max)) for _ in range(b)]
    label_lengths = [draw(st.integers(0, 3)) for _ in range(b)]
    l_max = max(label_lengths + [1])
    blank = draw(st.integers(0, c - 1))
    others = [k for k in range(c) if k != blank]
    labels = np.array([[draw(st.sampled_from(others)) for _ in range(l_max)] for _ in range(b)])
    seed = draw(st.integers(0, 2**32 - 1))
    logits = 2 * np.random.default_rng(seed).standard_normal((b, t_max, c))
    return logits, np.array(input_lengths), labels, np.array(label_lengths), blank


@given(ctc_cases())
def test_loss_and_gradient_equal_the_sum_over_alignments(case):
    logits, input_lengths, labels, label_lengths, blank = case
    nll = ctc_loss(logits, input_lengths, labels, label_lengths, blank=blank)
    dnll = np.linspace(0.5, 1.5, len(nll))
    grad = ctc_loss_backward(dnll, logits, input_lengths, labels, label_lengths, blank=blank)
    for b in range(len(nll)):
        t, n = input_lengths[b], label_lengths[b]
        want, want_grad = brute_force(logits[b, :t], labels[b, :n], blank)
        if np.isinf(want):
            assert nll[b] == np.inf
        else:
            np.testing.assert_allclose(nll[b], want, rtol=1e-10)
        np.testing.assert_allclose(grad[b, :t], dnll[b] * want_grad, rtol=1e-10, atol=1e-12)
        assert np.all(grad[b, t:] == 0)                       # frames past the utterance


def test_repeated_labels_need_a_blank_between():
    # (1, 1) in 2 frames is impossible; in 3 frames only 1 - 1 produces it
    logits = np.random.default_rng(0).standard_normal((1, 3, 3))
    y = np.exp(logits[0]) / np.exp(logits[0]).sum(axis=1, keepdims=True)
    nll = ctc_loss(logits, [3], [[1, 1]], [2])
    np.testing.assert_allclose(nll[0], -np.log(y[0, 1] * y[1, 0] * y[2, 1]), rtol=1e-12)
    assert ctc_loss(logits, [2], [[1, 1]], [2])[0] == np.inf
    assert np.isfinite(ctc_loss(logits, [2], [[1, 2]], [2])[0])       # (1, 2) fits in 2


def test_impossible_alignment_is_inf_with_zero_gradient():
    logits = np.random.default_rng(1).standard_normal((2, 4, 5))
    labels = np.array([[1, 2, 2, 3], [1, 2, 0, 0]])
    nll = ctc_loss(logits, [4, 4], labels, [4, 2])                  # 4 + 1 repeat > 4 frames
    grad = ctc_loss_backward(np.ones(2), logits, [4, 4], labels, [4, 2])
    assert nll[0] == np.inf and np.isfinite(nll[1])
    assert np.all(grad[0] == 0) and np.all(np.isfinite(grad)) and np.any(grad[1] != 0)


def test_gradient_matches_finite_differences():
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((3, 9, 5))
    args = (np.array([9, 6, 7]), np.array([[1, 1, 3, 4], [2, 4, 0, 0], [3, 3, 3, 0]]),
            np.array([4, 2, 3]))

    def f(x):
        return ctc_loss(x, *args)

    def f_backward(dnll, x):
        return (ctc_loss_backward(dnll, x, *args),)

    assert_gradients_match(f, f_backward, [logits])


def test_long_float32_input_has_no_nan():
    rng = np.random.default_rng(3)
    t, c, length = 4000, 30, 300
    logits = (4 * rng.standard_normal((2, t, c))).astype(np.float32)
    labels = rng.integers(1, c, (2, length))
    nll = ctc_loss(logits, [t, 3000], labels, [length, 250])
    grad = ctc_loss_backward(np.ones(2, np.float32), logits, [t, 3000], labels, [length, 250])
    assert nll.dtype == grad.dtype == np.float32
    assert np.all(np.isfinite(nll)) and np.all(nll > 0) and np.all(np.isfinite(grad))
    # y - gamma sums to 0 over the classes of every counted frame
    np.testing.assert_allclose(grad.sum(axis=-1), 0, atol=1e-5)
    assert np.all(grad[1, 3000:] == 0)


def test_batch_equals_each_utterance_alone_and_ignores_padding():
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((3, 12, 6))
    lengths, labels, label_lengths = np.array([12, 7, 9]), rng.integers(1, 6, (3, 5)), [5, 3, 1]
    nll = ctc_loss(logits, lengths, labels, label_lengths)
    grad = ctc_loss_backward(np.ones(3), logits, lengths, labels, label_lengths)
    noisy = logits.copy()
    noisy[1, 7:] = np.nan                                           # padding never read
    noisy[2, 9:] = 1e30
    np.testing.assert_array_equal(ctc_loss(noisy, lengths, labels, label_lengths), nll)
    np.testing.assert_array_equal(
        ctc_loss_backward(np.ones(3), noisy, lengths, labels, label_lengths), grad)
    for b in range(3):
        t, n = lengths[b], label_lengths[b]
        one = logits[b:b + 1, :t]
        np.testing.assert_allclose(ctc_loss(one, [t], labels[b:b + 1, :n], [n]), nll[b:b + 1],
                                   rtol=1e-12)
        np.testing.assert_allclose(
            ctc_loss_backward(np.ones(1), one, [t], labels[b:b + 1, :n], [n])[0], grad[b, :t],
            rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_loss_and_backward_together_give_the_loss_bit_for_bit(dtype):
    """The loss of the one lattice is ``ctc_loss``'s, bit for bit: ragged frames and labels,
    an impossible utterance (3 labels in 2 frames), repeated labels. (``ctc_loss_backward``
    returns this function's gradient; the next test holds it to finite differences.)"""
    rng = np.random.default_rng(7)
    logits = (3 * rng.standard_normal((4, 11, 5))).astype(dtype)
    lengths, labels = np.array([11, 6, 2, 9]), rng.integers(1, 5, (4, 4))
    labels[3, :3] = 2
    label_lengths, dnll = np.array([4, 2, 3, 3]), rng.standard_normal(4)
    nll, grad = ctc_loss_and_backward(dnll, logits, lengths, labels, label_lengths)
    assert np.isinf(nll[2]) and np.all(grad[2] == 0) and nll.dtype == grad.dtype == dtype
    np.testing.assert_array_equal(nll, ctc_loss(logits, lengths, labels, label_lengths))


def test_loss_and_backward_gradient_matches_finite_differences():
    rng = np.random.default_rng(8)
    logits = rng.standard_normal((3, 10, 5))
    args = (np.array([10, 7, 4]), np.array([[2, 2, 1], [4, 3, 0], [1, 0, 0]]),
            np.array([3, 2, 1]))

    def f_backward(dnll, x):
        return (ctc_loss_and_backward(dnll, x, *args)[1],)

    assert_gradients_match(lambda x: ctc_loss(x, *args), f_backward, [logits])


def test_large_logits_do_not_overflow_and_nan_propagates():
    logits = np.random.default_rng(5).standard_normal((1, 6, 4)) * 1e4
    assert np.isfinite(ctc_loss(logits, [6], [[1, 2]], [2])[0])
    assert np.all(np.isfinite(ctc_loss_backward(np.ones(1), logits, [6], [[1, 2]], [2])))
    logits[0, 2, 1] = np.nan
    with np.errstate(invalid="ignore"):                             # NaN in, NaN out
        assert np.isnan(ctc_loss(logits, [6], [[1, 2]], [2])[0])
        assert np.isnan(ctc_loss_backward(np.ones(1), logits, [6], [[1, 2]], [2])[0, 2]).all()


GOOD = dict(logits=np.zeros((2, 4, 3)), input_lengths=np.array([4, 3]),
            labels=np.array([[1, 2], [2, 0]]), label_lengths=np.array([2, 1]))


@pytest.mark.parametrize("change, match", [
    (dict(logits=np.zeros((2, 4), dtype=np.float64)), "logits must have shape"),
    (dict(logits=np.zeros((2, 4, 3), dtype=np.int64)), "logits must be a float"),
    (dict(input_lengths=np.array([4, 5])), "input_lengths must lie in 1..T"),
    (dict(input_lengths=np.array([0, 3])), "input_lengths must lie in 1..T"),
    (dict(input_lengths=np.array([4.0, 3.0])), "input_lengths must be an integer array"),
    (dict(input_lengths=np.array([4])), r"input_lengths must be an integer array of shape"),
    (dict(labels=np.array([1, 2])), "labels must be an integer array"),
    (dict(labels=np.array([[1, 3], [2, 0]])), "labels must be classes in 0..2"),
    (dict(labels=np.array([[1, 0], [2, 0]])), "including the blank"),
    (dict(label_lengths=np.array([3, 1])), "label_lengths must lie in 0..L_max"),
    (dict(blank=3), "blank must be a class index"),
])
def test_bad_inputs_are_named(change, match):
    kw = {**GOOD, **change}
    blank = kw.pop("blank", 0)
    with pytest.raises((ValueError, TypeError), match=match):
        ctc_loss(**kw, blank=blank)
    with pytest.raises((ValueError, TypeError), match=match):
        ctc_loss_backward(np.ones(2), **kw, blank=blank)
    with pytest.raises((ValueError, TypeError), match=match):
        ctc_loss_and_backward(np.ones(2), **kw, blank=blank)


def test_backward_checks_dnll_shape():
    with pytest.raises(ValueError, match="dnll must have shape"):
        ctc_loss_backward(np.ones(3), **GOOD)
    with pytest.raises(ValueError, match="dnll must have shape"):
        ctc_loss_and_backward(np.ones(3), **GOOD)


def test_greedy_decode_collapses_runs_and_drops_blanks():
    path = np.array([[1, 1, 0, 1, 2, 2, 0, 0, 3], [2, 0, 2, 2, 1, 1, 1, 1, 1]])
    logits = np.eye(4)[path]                                        # one-hot scores
    assert greedy_decode(logits, [9, 4]) == [[1, 1, 2, 3], [2, 2]]
    assert greedy_decode(logits, [9, 4], blank=1) == [[0, 2, 0, 3], [2, 0, 2]]


def _plain_edit_distance(a, b):
    d = np.zeros((len(a) + 1, len(b) + 1), dtype=int)
    d[:, 0], d[0, :] = np.arange(len(a) + 1), np.arange(len(b) + 1)
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i, j] = min(d[i - 1, j] + 1, d[i, j - 1] + 1, d[i - 1, j - 1] + (a[i - 1] != b[j - 1]))
    return d[-1, -1]


@given(st.lists(st.integers(0, 3), max_size=12), st.lists(st.integers(0, 3), max_size=12))
def test_edit_distance_matches_the_plain_programme(a, b):
    assert edit_distance(a, b) == _plain_edit_distance(a, b) == edit_distance(b, a)


def test_phoneme_error_rate():
    assert edit_distance(list("kitten"), list("sitting")) == 3
    assert phoneme_error_rate([[1, 2, 3], []], [[1, 2, 4], [5, 6]]) == 3 / 5
    assert phoneme_error_rate([[]], [[1, 2]]) == 1.0               # empty output: 100 %
    with pytest.raises(ValueError, match="hypotheses"):
        phoneme_error_rate([[1]], [[1], [2]])
    with pytest.raises(ValueError, match="no labels"):
        phoneme_error_rate([[1]], [[]])
