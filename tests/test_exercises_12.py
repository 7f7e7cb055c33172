"""The exercises of notebook 12: our solution passes each check, a wrong answer fails it with
an AssertionError, and an answer still raising NotImplementedError (the notebook's stub) is
reported as not attempted yet.

The checks and the solutions live beside the notebook, ``notebooks/checks/12_*.py`` and
``notebooks/solutions/12_*.py``, and are imported as the notebook imports them, with
``notebooks/`` on the path.
"""
import ast
import importlib
import pathlib
import sys

import numpy as np
import pytest

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
STEM = "12_the_state_as_fast_weights"


def load(kind):
    if str(NOTEBOOKS) not in sys.path:
        sys.path.insert(0, str(NOTEBOOKS))
    return importlib.import_module(f"{kind}.{STEM}")


def unwritten(*args):
    raise NotImplementedError   # your code here


def _cases():
    """exercise -> (the solution's answers, wrong answers, the stub)."""
    s = load("solutions")

    def state_by_factoring(S, phi_k, g, v):     # exp(b_C) exp(-b_j): overflows, strong gates
        b = np.cumsum(g, axis=0)
        return np.exp(b[-1])[:, None] * (S + (phi_k * np.exp(-b)).T @ v)

    def state_undecayed(S, phi_k, g, v):        # forgets to decay the entering state
        b = np.cumsum(g, axis=0)
        return S + (phi_k * np.exp(b[-1] - b)).T @ v

    def state_decayed_once_too_often(S, phi_k, g, v):   # exp(b_C - b_j + g_j): off by one
        b = np.cumsum(g, axis=0)
        return np.exp(b[-1])[:, None] * S + (phi_k * np.exp(b[-1] - b + g)).T @ v

    def T_without_interactions(K, beta):        # diag(beta): right only for orthogonal keys
        return np.diag(beta)

    def T_wrong_sign(K, beta):                  # (I - tril(...))^-1 diag(beta)
        L = np.tril(beta[:, None] * (K @ K.T), -1)
        return np.linalg.solve(np.eye(len(beta)) - L, np.diag(beta))

    return {
        1: ((s.chunk_state,),
            [(state_by_factoring,), (state_undecayed,), (state_decayed_once_too_often,)],
            (unwritten,)),
        2: ((s.predict_readouts,),
            [(lambda a, b, c: (b, b),),             # the sum overwrites too
             (lambda a, b, c: (a + b, a + b),),     # the delta rule adds too
             (lambda a, b, c: (a + b, a + b + c),)],   # orthogonal keys leak
            (unwritten,)),
        3: ((s.wy_T,), [(T_without_interactions,), (T_wrong_sign,)], (unwritten,)),
    }


CASES = _cases()
WRONG = [(n, i) for n in CASES for i in range(len(CASES[n][1]))]


def check(number):
    return getattr(load("checks"), f"check_exercise_{number}")


@pytest.mark.parametrize("number", CASES)
def test_solution_passes_its_check(number, capsys):
    check(number)(*CASES[number][0])
    assert capsys.readouterr().out.strip() == f"Exercise {number}: correct"


@pytest.mark.parametrize("number, wrong", WRONG, ids=[f"{n}-wrong-{i}" for n, i in WRONG])
def test_check_rejects_a_wrong_answer(number, wrong, capsys):
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"), \
            pytest.raises(AssertionError):
        check(number)(*CASES[number][1][wrong])
    assert "correct" not in capsys.readouterr().out


@pytest.mark.parametrize("number", CASES)
def test_check_says_when_an_answer_is_not_written(number, capsys):
    check(number)(*CASES[number][2])
    assert capsys.readouterr().out.startswith(f"Exercise {number}: not attempted yet")


def test_checks_never_import_solutions():
    tree = ast.parse((NOTEBOOKS / "checks" / f"{STEM}.py").read_text())
    names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names]
    names += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert not any("solutions" in name for name in names), names


def test_every_exercise_has_a_case():
    checks = load("checks")
    numbers = {int(name.rsplit("_", 1)[1]) for name in dir(checks)
               if name.startswith("check_exercise_")}
    assert numbers == set(CASES)
