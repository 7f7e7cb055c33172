"""The associative-retrieval layer (model.retrieval): its task, its hand-written gradient
against central differences, queries that write nothing, and training that learns."""
import numpy as np
import pytest

from helpers import numerical_parameter_gradients
from linattn.model import retrieval
from linattn.model.tasks import batch_rng

TASK = retrieval.RetrievalTask(pairs=5, n_keys=12, n_values=4, n_queries=3)


def test_a_batch_stores_distinct_keys_and_asks_for_stored_ones():
    keys, values, targets = retrieval.RetrievalTask(pairs=6, n_keys=9).batch(
        np.random.default_rng(0), 50)
    assert keys.shape == (50, 6 + 8) and values.shape == (50, 6) and targets.shape == (50, 8)
    for row_keys, row_values, row_targets in zip(keys, values, targets):
        stored = dict(zip(row_keys[:6], row_values))
        assert len(stored) == 6                                   # distinct keys
        assert [stored[k] for k in row_keys[6:]] == list(row_targets)


@pytest.mark.parametrize("attention", retrieval.ATTENTIONS)
def test_gradients_equal_central_differences(attention):
    params = retrieval.init_params(attention, 6, TASK, seed=1)
    batch = TASK.batch(np.random.default_rng(2), 3)
    _, grads, _ = retrieval.loss_and_grads(params, attention, TASK, *batch)
    assert set(grads) == set(params)
    want = numerical_parameter_gradients(
        params, lambda: retrieval.loss_and_grads(params, attention, TASK, *batch)[0])
    for name in params:
        np.testing.assert_allclose(grads[name], want[name], rtol=1e-5, atol=1e-8,
                                   err_msg=f"{attention}: {name}")


@pytest.mark.parametrize("attention", retrieval.ATTENTIONS)
def test_queries_write_nothing(attention):
    # each answer depends on the pairs and its own query only: asked one at a time, in
    # reverse order or all together, the queries get the same losses
    params = retrieval.init_params(attention, 6, TASK, seed=3)
    keys, values, targets = TASK.batch(np.random.default_rng(4), 1)
    n = TASK.pairs
    flipped = np.concatenate([keys[:, :n], keys[:, n:][:, ::-1]], axis=1)
    one = [retrieval.loss_and_grads(params, attention, TASK._replace(n_queries=1),
                                    np.concatenate([keys[:, :n], keys[:, n + j:n + j + 1]], 1),
                                    values, targets[:, j:j + 1])[0]
           for j in range(TASK.n_queries)]
    together = retrieval.loss_and_grads(params, attention, TASK, keys, values, targets)[0]
    reversed_ = retrieval.loss_and_grads(params, attention, TASK, flipped, values,
                                         targets[:, ::-1])[0]
    assert together == pytest.approx(np.mean(one), rel=1e-12)
    assert reversed_ == pytest.approx(together, rel=1e-12)


def test_training_learns_a_small_task():
    task = retrieval.RetrievalTask(pairs=2, n_keys=8, n_values=4, n_queries=2)
    cfg = retrieval.RetrievalConfig(d=8, steps=150, batch_size=16, eval_batches=2)
    start = np.mean([retrieval.loss_and_grads(
        retrieval.init_params("softmax", cfg.d, task), "softmax", task,
        *task.batch(batch_rng(0, i, stream=1), cfg.batch_size))[0] for i in range(2)])
    _, loss, accuracy = retrieval.train("softmax", task, cfg)
    assert loss < 0.5 * start and accuracy > 0.6


def test_bad_names_and_sizes_are_refused():
    with pytest.raises(ValueError, match="unknown attention 'lstm'"):
        retrieval.init_params("lstm", 4, TASK)
    with pytest.raises(ValueError, match="pairs must be in 1..n_keys=12"):
        TASK._replace(pairs=13).batch(np.random.default_rng(0), 2)
