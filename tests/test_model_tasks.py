"""The copy task's layout and the digits loader (skipped without scikit-learn)."""
import sys

import numpy as np
import pytest

from linattn.model.tasks import CopyTask, batch_rng, load_digits, upsample


@pytest.mark.parametrize("variable", [True, False])
def test_copy_batch_layout(variable):
    task = CopyTask(length=6, variable=variable)
    ids, targets, weights = task.batch(batch_rng(0, 0), 50)
    assert ids.shape == targets.shape == weights.shape == (50, task.seq_len)
    np.testing.assert_array_equal(ids[:, 1:], targets[:, :-1])      # targets are ids shifted
    for row_ids, row_t, row_w in zip(ids, targets, weights):
        seq = np.concatenate([row_ids, row_t[-1:]])
        n = int(row_w.sum())                                          # the copied length
        assert 1 <= n <= 6 and (variable or n == 6)
        assert seq[0] == seq[n + 1] == task.sep
        w = seq[1:n + 1]
        assert np.all(w < task.n_symbols)
        np.testing.assert_array_equal(seq[n + 2:2 * n + 2], w)       # the copy
        assert np.all(seq[2 * n + 2:] == task.pad)
        np.testing.assert_array_equal(row_t[row_w == 1], w)          # loss counts the copy
    if variable:
        assert len(np.unique(weights.sum(axis=1))) > 3


def test_batches_are_a_function_of_seed_and_step():
    task = CopyTask(length=5)
    a, b = task.batch(batch_rng(1, 7), 4), task.batch(batch_rng(1, 7), 4)
    c = task.batch(batch_rng(1, 8), 4)
    held_out = task.batch(batch_rng(1, 7, stream=1), 4)
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0]) and not np.array_equal(a[0], held_out[0])


def test_copy_prompts():
    task = CopyTask(length=4)
    prompt, w = task.prompts(batch_rng(0, 0), 3)
    assert prompt.shape == (3, 6) and w.shape == (3, 4)
    assert np.all(prompt[:, [0, -1]] == task.sep)
    np.testing.assert_array_equal(prompt[:, 1:-1], w)


def test_digits():
    pytest.importorskip("sklearn")
    task = load_digits()
    assert task.train.shape == (1500, 64) and task.test.shape == (297, 64)
    assert task.train.min() == 0 and task.train.max() == 16
    ids, targets, weights = task.batch(batch_rng(0, 0), 5)
    assert ids.shape == (5, 64) and np.all(ids[:, 0] == task.start)
    np.testing.assert_array_equal(ids[:, 1:], targets[:, :-1])
    assert sum(len(b[0]) for b in task.test_batches(100)) == 297
    # the split is fixed: no test image is a training row (digits has few exact repeats)
    train = {r.tobytes() for r in task.train}
    assert sum(r.tobytes() in train for r in task.test) < 5


def test_digits_without_sklearn_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ImportError, match=r"linattn\[digits\]"):
        load_digits()


def test_upsample_keeps_levels_and_constant_images():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 17, (3, 8, 8))
    np.testing.assert_array_equal(upsample(images, 8), images)      # same size: unchanged
    big = upsample(images, 16)
    assert big.shape == (3, 16, 16) and big.min() >= 0 and big.max() <= 16
    np.testing.assert_array_equal(upsample(np.full((1, 8, 8), 5), 16), np.full((1, 16, 16), 5))
    # a ramp stays a ramp: between its neighbours' levels, rising along the rows
    ramp = upsample(np.tile(2 * np.arange(8), (1, 8, 1)), 16)[0, 0]
    assert np.all(np.diff(ramp) >= 0) and ramp[0] == 0 and ramp[-1] == 14


def test_digits_at_16x16():
    pytest.importorskip("sklearn")
    task = load_digits(side=16)
    assert task.train.shape == (1500, 256) and task.test.shape == (297, 256)
    assert task.seq_len == 256 and task.train.min() >= 0 and task.train.max() <= 16
    ids, targets, _ = task.batch(batch_rng(0, 0), 4)
    assert ids.shape == targets.shape == (4, 256) and np.all(ids[:, 0] == task.start)
