"""Options typed strictly: a flag is a bool, a count an integer; a step takes one position;
a Recurrence's sizes are read-only."""
import numpy as np
import pytest

import linattn
from linattn import Recurrence, linear_attention, linear_attention_step

Q = np.random.default_rng(0).standard_normal((2, 3, 4))


@pytest.mark.parametrize("call", [
    lambda c: linear_attention(Q, Q, Q, causal=c, backend="numpy"),
    lambda c: linattn.softmax_attention(Q, Q, Q, causal=c, backend="numpy"),
    lambda c: linattn.lsh_attention(Q, Q, causal=c, backend="numpy"),
    lambda c: linear_attention_step(Q[:, 0], Q[:, 0], Q[:, 0], compensated=c,
                                    backend="numpy"),
    lambda c: Recurrence((2,), 4, 4, compensated=c, backend="numpy"),
])
@pytest.mark.parametrize("flag", ["False", "", 1, 0, None, 1.0])
def test_a_flag_that_is_not_a_bool_is_refused(call, flag):
    with pytest.raises(TypeError, match="must be True or False"):
        call(flag)


def test_numpy_bools_are_bools():
    want = linear_attention(Q, Q, Q, causal=True, backend="numpy")
    got = linear_attention(Q, Q, Q, causal=np.bool_(True), backend="numpy")
    np.testing.assert_array_equal(got, want)
    assert not np.allclose(linear_attention(Q, Q, Q, causal=np.bool_(False),
                                            backend="numpy"), want)


@pytest.mark.parametrize("value", [2.0, True, "2"])
def test_a_count_that_is_not_an_integer_is_refused(value):
    with pytest.raises((TypeError, ValueError), match="chunk_size"):
        linear_attention(Q, Q, Q, chunk_size=value, method="chunked", backend="numpy")
    with pytest.raises(TypeError, match="n_hashes"):
        linattn.lsh_attention(Q, Q, n_hashes=value, backend="numpy")
    with pytest.raises(TypeError, match="seed"):
        linattn.lsh_attention(Q, Q, seed=value, backend="numpy")
    with pytest.raises(TypeError, match="n_features"):
        linattn.Favor(n_features=value)
    assert linattn.lsh_attention(Q, Q, n_hashes=np.int64(2), backend="numpy").shape == Q.shape


def test_a_whole_sequence_given_to_a_step_with_a_state_is_named():
    _, state = linear_attention_step(Q[:, 0], Q[:, 0], Q[:, 0], backend="numpy")
    with pytest.raises(ValueError, match="whole sequence"):
        linear_attention_step(Q, Q, Q, state, backend="numpy")
    # one position with the state's leading axes goes through
    assert linear_attention_step(Q[:, 1], Q[:, 1], Q[:, 1], state, backend="numpy")[0].shape \
        == (2, 4)


def test_a_whole_sequence_given_to_recurrence_step_is_named():
    rnn = Recurrence((2,), 4, 4, dtype="float64", backend="numpy")
    with pytest.raises(ValueError, match="whole sequence of 3 positions"):
        rnn.step(Q, Q, Q)
    with pytest.raises(ValueError) as info:                 # another wrong shape: no hint
        rnn.step(Q[:1, 0], Q[:1, 0], Q[:1, 0])
    assert "whole sequence" not in str(info.value)


@pytest.mark.parametrize("name", ["lead_shape", "d", "m", "feature_width", "dtype",
                                  "compensated", "backend"])
def test_recurrence_sizes_are_read_only(name):
    rnn = Recurrence((2,), 4, 4, backend="numpy")
    before = getattr(rnn, name)
    with pytest.raises(AttributeError):
        setattr(rnn, name, before)
    with pytest.raises(AttributeError):
        rnn.eps = 0.1                                     # no new attributes either
    assert getattr(rnn, name) == before
