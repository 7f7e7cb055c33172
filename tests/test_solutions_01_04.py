"""The exercises of notebooks 01-04: every solution passes its check, an untouched exercise
(a function still raising NotImplementedError) is reported as not attempted, and a wrong
answer fails its check with an AssertionError.

The solutions and checks live in ``notebooks/solutions/NN_name.py``; the notebooks load
them by ``importlib.import_module("solutions.NN_name")``.
"""
import importlib
import pathlib
import sys

import numpy as np
import pytest

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"


def load(stem):
    """The module ``solutions.<stem>``, imported as the notebooks import it."""
    if str(NOTEBOOKS) not in sys.path:
        sys.path.insert(0, str(NOTEBOOKS))
    return importlib.import_module(f"solutions.{stem}")


nb01 = load("01_softmax_attention")
nb02 = load("02_kernels_and_associativity")
nb03 = load("03_causal_masking")
nb04 = load("04_transformers_are_rnns")


def not_yet(*args, **kwargs):
    raise NotImplementedError


# (check, the solution's answers, answers with a mistake in them)
CASES = {
    "01-1": (nb01.check_exercise_1, (nb01.PREDICTED_SLOPES,),
             ({"numpy": {"time": 2, "memory": 2}, "numba": {"time": 2, "memory": 2}},)),
    "01-2": (nb01.check_exercise_2, (nb01.stable_softmax,),
             (lambda x: np.exp(x) / np.exp(x).sum(axis=-1, keepdims=True),)),
    "01-3": (nb01.check_exercise_3, (nb01.softmax_attention_by_hand,),
             (lambda q, k, v, causal=False: nb01.softmax_attention_by_hand(q, k, v),)),
    "02-1": (nb02.check_exercise_1, (nb02.linear_attention_einsum,),
             (lambda q, k, v, eps=1e-6: _quadratic(q, k, v, eps),)),
    "02-2": (nb02.check_exercise_2, (nb02.matmul_multiply_adds, nb02.cheaper_from),
             (nb02.matmul_multiply_adds, lambda f, m: 2 * f * m // (f + m))),
    "02-3": (nb02.check_exercise_3, (nb02.softmax_weight_kept,),
             (lambda qk, n_hashes, chunk_size: _pairs_kept(qk, n_hashes, chunk_size),)),
    "03-1": (nb03.check_exercise_1, (nb03.causal_linear_attention,),
             (lambda q, k, v, eps=1e-6: _quadratic(q, k, v, eps, causal=True),)),
    "03-2": (nb03.check_exercise_2, (nb03.chunked_causal_linear_attention,),
             (lambda q, k, v, c, eps=1e-6: _chunks_without_state(q, k, v, c, eps),)),
    "04-1": (nb04.check_exercise_1, (nb04.rnn_step,),
             (lambda q, k, v, S, z, eps=1e-6: _step_without_z(q, k, v, S, z, eps),)),
    "04-2": (nb04.check_exercise_2, (nb04.state_bytes, nb04.cache_bytes, nb04.cache_larger_from),
             (lambda f, m, size: f * m * size, nb04.cache_bytes, nb04.cache_larger_from)),
}


def _features(x):
    return np.where(x > 0, x + 1, np.exp(x))                     # elu + 1, Eq. (7)


def _quadratic(q, k, v, eps, causal=False):
    """Right values, but through the N x N matrix: the memory checks must catch it."""
    a = _features(q) @ np.swapaxes(_features(k), -1, -2)
    if causal:
        a = np.tril(a)
    return (a @ v) / (a.sum(axis=-1, keepdims=True) + eps)


def _chunks_without_state(q, k, v, c, eps):
    """Algorithm 3 with the inter-chunk term forgotten."""
    phi_q, phi_k = _features(q), _features(k)
    v1 = np.concatenate([v, np.ones((len(v), 1))], axis=1)
    out = np.concatenate([np.tril(phi_q[s:s + c] @ phi_k[s:s + c].T) @ v1[s:s + c]
                          for s in range(0, len(v), c)])
    return out[:, :-1] / (out[:, -1:] + eps)


def _step_without_z(q, k, v, S, z, eps):
    """Eq. (18) and (20) right, Eq. (19) forgotten: z never grows."""
    out, S, _ = nb04.rnn_step(q, k, v, S, z, eps)
    return out, S, z


def _pairs_kept(qk, n_hashes, chunk_size):
    """The share of the pairs, not of the softmax weight."""
    import linattn
    return float(linattn.lsh_attention_mask(qk, n_hashes=n_hashes, chunk_size=chunk_size).mean())


@pytest.mark.parametrize("case", CASES)
def test_solution_passes_its_check(case, capsys):
    check, solution, _ = CASES[case]
    assert check(*solution) is None
    assert "correct" in capsys.readouterr().out


@pytest.mark.parametrize("case", CASES)
def test_untouched_exercise_is_not_attempted(case, capsys):
    check, solution, _ = CASES[case]
    if case == "01-1":
        answers = ({"numpy": {"time": None, "memory": None},
                    "numba": {"time": None, "memory": None}},)
    else:
        answers = (not_yet,) * len(solution)
    assert check(*answers) is None
    assert "not attempted" in capsys.readouterr().out


@pytest.mark.parametrize("case", CASES)
def test_wrong_answer_fails_its_check(case):
    check, _, wrong = CASES[case]
    with pytest.raises(AssertionError), np.errstate(over="ignore", invalid="ignore"):
        check(*wrong)
