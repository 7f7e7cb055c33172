"""Bad input gets a clear error, never a wrong answer: one test per bad input, run against
every public function that takes it (validation lives in ``linattn._checks``)."""
import numpy as np
import pytest

from linattn import (linear_attention, linear_attention_backward, softmax_attention,
                     softmax_attention_backward)

from helpers import random_qkv

FORWARDS = [linear_attention, softmax_attention]
BACKWARDS = [linear_attention_backward, softmax_attention_backward]
PAIRS = list(zip(FORWARDS, BACKWARDS))

BAD_SHAPES = [
    ((5, 3), (5, 3), (4, 2), "same length Nk"),
    ((5, 3), (6, 3), (5, 2), "same length Nk"),
    ((5, 3), (5, 4), (5, 2), "same width D"),
    ((2, 5, 3), (3, 5, 3), (2, 5, 2), "same leading dimensions"),
    ((2, 5, 3), (2, 5, 3), (5, 2), "same leading dimensions"),
    ((3,), (3,), (3,), "shape \\(..., N, D\\)"),
    ((5, 0), (5, 0), (5, 2), "D >= 1"),
]


@pytest.mark.parametrize("qs, ks, vs, message", BAD_SHAPES)
@pytest.mark.parametrize("forward, backward", PAIRS)
def test_bad_shapes_name_the_shapes(qs, ks, vs, message, forward, backward):
    with pytest.raises(ValueError, match=message) as info:
        forward(np.ones(qs), np.ones(ks), np.ones(vs))
    assert str(qs).replace(" ", "") in str(info.value).replace(" ", "")
    with pytest.raises(ValueError, match=message):
        backward(np.ones(vs), np.ones(qs), np.ones(ks), np.ones(vs))


@pytest.mark.parametrize("backward", BACKWARDS)
def test_bad_dout_shape(backward):
    q, k, v = random_qkv(17, 5, 3, 2)
    with pytest.raises(ValueError, match="dout"):
        backward(np.ones((5, 3)), q, k, v)


@pytest.mark.parametrize("dtype", [np.int64, np.int8, bool, np.complex128, object])
@pytest.mark.parametrize("forward, backward", PAIRS)
def test_non_float_dtypes_are_type_errors(dtype, forward, backward):
    q, k, v = random_qkv(18, 4, 2, 2)
    with pytest.raises(TypeError, match="dtype"):
        forward(q.astype(dtype), k, v)
    with pytest.raises(TypeError, match="dtype"):
        backward(v, q, k, v.astype(dtype))


@pytest.mark.parametrize("forward", FORWARDS)
def test_float16_in_float16_out(forward):
    q, k, v = (x.astype(np.float16) for x in random_qkv(19, 6, 3, 2))
    out = forward(q, k, v, causal=True)
    want = forward(*(x.astype(np.float32) for x in (q, k, v)), causal=True)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, want.astype(np.float16))


@pytest.mark.parametrize("forward", FORWARDS)
@pytest.mark.parametrize("causal", [False, True])
def test_empty_sequence_gives_empty_output(forward, causal):
    q, k, v = random_qkv(20, 0, 3, 4, (2,))
    assert forward(q, k, v, causal=causal).shape == (2, 0, 4)


