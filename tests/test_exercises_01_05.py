"""The exercises of notebooks 01-05: every solution passes its check, a wrong answer fails
it with an AssertionError (the check tells wrong from right), and an answer still raising
NotImplementedError, the notebook's stub, is reported as not attempted yet.

Checks live in ``notebooks/checks/NN_name.py``, our answers in
``notebooks/solutions/NN_name.py``; both are imported as the notebooks import them, with
``notebooks/`` on the path.
"""
import importlib
import pathlib
import re
import sys

import numpy as np
import pytest

import linattn

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"


def load(package, stem):
    if str(NOTEBOOKS) not in sys.path:
        sys.path.insert(0, str(NOTEBOOKS))
    return importlib.import_module(f"{package}.{stem}")


STEMS = {"01": "01_softmax_attention", "02": "02_kernels_and_associativity",
         "03": "03_causal_masking", "04": "04_transformers_are_rnns",
         "05": "05_gradients_by_hand"}
checks = {nb: load("checks", stem) for nb, stem in STEMS.items()}
solutions = {nb: load("solutions", stem) for nb, stem in STEMS.items()}
s01, s02, s03, s04, s05 = (solutions[nb] for nb in STEMS)


def stub(*args, **kwargs):
    raise NotImplementedError


def _merge_without_rescaling(a, b):
    return np.maximum(a[0], b[0]), a[1] + b[1], a[2] + b[2]


def _mask_values_only(q, k, v, key_mask, eps=1e-6):
    return linattn.linear_attention(q, k, v * key_mask[..., None], eps=eps)


def _inclusive_state(q, k, v, c, eps=1e-6):
    """The state entering block b counts block b too (an inclusive cumulative sum)."""
    phi = linattn.EluPlusOne()
    n = len(q)
    phi_q = phi.forward(q).reshape(n // c, c, -1)
    phi_k = phi.forward(k).reshape(n // c, c, -1)
    v1 = np.concatenate([v, np.ones((n, 1))], axis=1).reshape(n // c, c, -1)
    per_block = np.swapaxes(phi_k, 1, 2) @ v1
    inside = np.tril(phi_q @ np.swapaxes(phi_k, 1, 2)) @ v1
    num_den = (inside + phi_q @ np.cumsum(per_block, axis=0)).reshape(n, -1)
    return num_den[:, :-1] / (num_den[:, -1:] + eps)


# notebook-exercise: (the solution's answers, answers with a mistake in them)
CASES = {
    "01-1": ((s01.predicted_slopes,),
             (lambda: {"numpy": {"time": 2, "memory": 2}, "numba": {"time": 2, "memory": 2}},)),
    "01-2": ((s01.merge,), (_merge_without_rescaling,)),
    "01-3": ((s01.softmax_attention_tiled,),                   # right values, N x N memory
             (lambda q, k, v, tile: linattn.softmax_attention(q, k, v, backend="numpy"),)),
    "02-1": ((s02.linear_attention_key_mask,), (_mask_values_only,)),
    "02-2": ((s02.matmul_multiply_adds, s02.cheaper_from_queries),
             (s02.matmul_multiply_adds, lambda n_k, f, m: 2 * f * m // (f + m) + 1)),
    "02-3": ((s02.pairs_kept_one_round,), (lambda n, c: n * 2 * c,)),
    "03-1": ((s03.chunked_causal_vectorized,), (_inclusive_state,)),
    "03-2": ((s03.windowed_linear_attention,),
             (lambda q, k, v, w, eps=1e-6: s03.windowed_linear_attention(q, k, v, w + 1, eps),)),
    "04-1": ((s04.prefill_state,),                              # forgets the feature map
             (lambda k, v: (np.swapaxes(k, -1, -2) @ v, k.sum(axis=-2)),)),
    "04-2": ((s04.decayed_step, s04.decayed_attention_parallel),
             (s04.decayed_step,                                 # the parallel form undecayed
              lambda q, k, v, gamma, eps=1e-6: linattn.linear_attention(q, k, v, causal=True,
                                                                        eps=eps))),
    "05-1": ((s05.relu_vjp, s05.dead_query_prediction),
             (s05.relu_vjp, lambda: (0.0, 1e6))),
    "05-2": ((s05.softmax_attention_backward_tiled,),          # right values, N x N memory
             (lambda dout, q, k, v, tile: linattn.softmax_attention_backward(
                 dout, q, k, v, backend="numpy"),)),
    "05-3": ((s05.linear_attention_backward_noncausal,),
             (lambda dout, q, k, v: linattn.linear_attention_backward(dout, q, k, v,
                                                                      causal=True),)),
}


def check_of(case):
    notebook, number = case.split("-")
    return getattr(checks[notebook], f"check_exercise_{number}")


@pytest.mark.parametrize("case", CASES)
def test_solution_passes_its_check(case, capsys):
    solution, _ = CASES[case]
    assert check_of(case)(*solution) is None
    assert f"Exercise {int(case[-1])}: correct" in capsys.readouterr().out


@pytest.mark.parametrize("case", CASES)
def test_wrong_answer_fails_its_check(case):
    _, wrong = CASES[case]
    with pytest.raises(AssertionError), np.errstate(over="ignore", invalid="ignore"):
        check_of(case)(*wrong)


@pytest.mark.parametrize("case", CASES)
def test_stub_is_not_attempted_yet(case, capsys):
    solution, _ = CASES[case]
    assert check_of(case)(*[stub] * len(solution)) is None
    assert f"Exercise {int(case[-1])}: not attempted yet" in capsys.readouterr().out


def test_every_check_has_a_case():
    numbers = {f"{nb}-{name.rsplit('_', 1)[1]}" for nb, module in checks.items()
               for name in dir(module) if name.startswith("check_exercise_")}
    assert numbers == set(CASES)


def test_checks_never_import_solutions():
    importing = re.compile(r"^\s*(from|import)\s+solutions|import_module\([\"']solutions",
                           re.MULTILINE)
    for path in (NOTEBOOKS / "checks").glob("*.py"):
        assert not importing.search(path.read_text()), path.name
