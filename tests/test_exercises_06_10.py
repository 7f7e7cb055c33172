"""The exercises of notebooks 06-11: our solution passes each check, a wrong answer fails it
with an AssertionError, and an answer still raising NotImplementedError (the notebook's
stub) is reported as not attempted yet.

The checks and the solutions live beside the notebooks, ``notebooks/checks/NN_name.py`` and
``notebooks/solutions/NN_name.py``, and are imported as the notebooks import them, with
``notebooks/`` on the path.
"""
import ast
import importlib
import pathlib
import sys

import numpy as np
import pytest


NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
STEMS = {"06": "06_feature_maps", "07": "07_training_a_linear_transformer",
         "08": "08_gpu_kernels", "09": "09_rounding_in_the_state",
         "10": "10_speech_ctc", "11": "11_float16_and_eps"}


def load(kind, number):
    if str(NOTEBOOKS) not in sys.path:
        sys.path.insert(0, str(NOTEBOOKS))
    return importlib.import_module(f"{kind}.{STEMS[number]}")


def unwritten(*args):
    raise NotImplementedError   # your code here


class UnwrittenMap:
    forward = vjp = staticmethod(unwritten)


def _cases():
    """(notebook, exercise) -> (the solution's answers, a wrong answer, the stub)."""
    s06, s07, s08 = load("solutions", "06"), load("solutions", "07"), load("solutions", "08")
    s09, s10, s11 = load("solutions", "09"), load("solutions", "10"), load("solutions", "11")

    class NoSlope(s06.Softplus):            # right features, a vjp that forgets the slope
        def vjp(self, x, dphi):
            return dphi

    def taylor3_wrong(x):                   # the cubic block over 6, not sqrt(6)
        got = s06.taylor3_features(x)
        d = x.shape[-1]
        got[..., 1 + d + d * d:] /= np.sqrt(6)
        return got

    def generate_without_feedback(params, cfg, prompt, n_new):   # repeats the prompt's end
        return np.concatenate([prompt, np.repeat(prompt[:, -1:], n_new, axis=1)], axis=1)

    def in_chunk_only(dout, phi_k, v, c):    # forgets the state entering each chunk
        return np.concatenate([np.tril(dout[s:s + c] @ v[s:s + c].T) @ phi_k[s:s + c]
                               for s in range(0, len(dout), c)])

    def two_sum_float64(a, b):               # the error left out
        return a + b, np.zeros_like(a)

    return {
        ("06", 1): ((s06.elu_plus_one, s06.elu_plus_one_vjp),
                    (lambda x: np.maximum(x, 0) + 1, s06.elu_plus_one_vjp),
                    (unwritten, unwritten)),
        ("06", 2): ((s06.taylor3_features,), (taylor3_wrong,), (unwritten,)),
        ("06", 3): ((s06.Softplus(),), (NoSlope(),), (UnwrittenMap(),)),
        ("07", 1): ((s07.cross_entropy_grad,),
                    (lambda logits, targets, weights: s07.cross_entropy_grad(
                        logits, targets, np.ones_like(weights)),),
                    (unwritten,)),
        ("07", 2): ((s07.adam_step,),
                    (lambda p, g, m, v, t, lr, b1, b2, eps: s07.adam_step(
                        p, g, m, v, 1, lr, b1, b2, eps),),       # forgets t in the correction
                    (unwritten,)),
        ("07", 3): ((s07.greedy_generate,), (generate_without_feedback,), (unwritten,)),
        ("08", 1): ((s08.reverse_exclusive_scan,),
                    (lambda x: np.cumsum(x[:, ::-1], axis=1)[:, ::-1],),   # inclusive
                    (unwritten,)),
        ("08", 2): ((s08.chunked_dq,),
                    (in_chunk_only,), (unwritten,)),
        ("08", 3): ((s08.chunked_dv,),
                    (lambda dout, phi_q, phi_k, c: s08.chunked_dv(dout, phi_q, phi_k, c) * 0.5,),
                    (unwritten,)),
        ("09", 1): ((s09.two_sum,), (two_sum_float64,), (unwritten,)),
        ("09", 2): ((s09.kahan_cumsum,), (np.cumsum,), (unwritten,)),
        ("10", 1): ((s10.n_alignments,), (lambda t, l: 3 ** t,), (unwritten,)),
        ("10", 2): ((s10.min_frames,), (len,), (unwritten,)),
        ("10", 3): ((s10.ctc_nll,),
                    (lambda log_p, target: -np.log(np.exp(-s10.ctc_nll(log_p, target))),),
                    (unwritten,)),
        ("11", 1): ((s11.elu_plus_one_mean,),
                    (lambda mu: 1 / np.sqrt(2 * np.pi) + 0.5 + np.exp(0.5) * 0.1587,),
                    (unwritten,)),                               # mu = 0's value for every mu
        ("11", 2): ((s11.float16_overflow_n,),
                    (lambda mean: int(float(np.finfo(np.float16).max) / mean),), (unwritten,)),
        ("11", 3): ((s11.exp_underflow_below,), (lambda: -87.3,), (unwritten,)),
    }


CASES = _cases()
IDS = [f"{nb}-exercise-{n}" for nb, n in CASES]


def check(key):
    return getattr(load("checks", key[0]), f"check_exercise_{key[1]}")


@pytest.mark.parametrize("key", CASES, ids=IDS)
def test_solution_passes_its_check(key, capsys):
    check(key)(*CASES[key][0])
    assert capsys.readouterr().out.strip() == f"Exercise {key[1]}: correct"


@pytest.mark.parametrize("key", CASES, ids=IDS)
def test_check_rejects_a_wrong_answer(key, capsys):
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"), \
            pytest.raises(AssertionError):
        check(key)(*CASES[key][1])
    assert "correct" not in capsys.readouterr().out


@pytest.mark.parametrize("key", CASES, ids=IDS)
def test_check_says_when_an_answer_is_not_written(key, capsys):
    check(key)(*CASES[key][2])
    assert capsys.readouterr().out.startswith(f"Exercise {key[1]}: not attempted yet")


@pytest.mark.parametrize("number", sorted(STEMS))
def test_checks_never_import_solutions(number):
    tree = ast.parse((NOTEBOOKS / "checks" / f"{STEMS[number]}.py").read_text())
    names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names]
    names += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert not any("solutions" in name for name in names), names


@pytest.mark.parametrize("number", sorted(STEMS))
def test_every_exercise_has_a_case(number):
    checks = load("checks", number)
    numbers = {int(name.rsplit("_", 1)[1]) for name in dir(checks)
               if name.startswith("check_exercise_")}
    assert numbers == {n for nb, n in CASES if nb == number}
