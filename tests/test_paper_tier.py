"""The paper tier (linattn.lab.paper): units resume after an interruption without repeating
finished models and end where an unbroken run ends; the CSVs say which tier wrote them;
speech on fresh utterances each epoch resumes exactly too."""
import json

import numpy as np
import pytest

from linattn.lab import figures, paper
from linattn.lab.paper_experiments import copy_units
from linattn.model import train as model_train
from linattn.model.checkpoint import load_checkpoint
from linattn.model.optim import AdamConfig
from linattn.model.speech import train as speech_train
from linattn.model.speech.task import SpeechTask
from linattn.model.speech.train import SpeechTrainConfig, run_speech, speech_setup

COPY = dict(paper.CONFIGS["tiny"]["copy"], attentions=("softmax", "linear"))


class Interrupted(Exception):
    """What the tests raise to stop a run midway, as a kill would."""


def _stop_after(monkeypatch, module, updates):
    """Make ``module``'s Adam updates raise ``Interrupted`` once ``updates`` have run."""
    real, count = module.adam_update, [0]

    def update(*args, **kwargs):
        if count[0] == updates:
            raise Interrupted
        count[0] += 1
        return real(*args, **kwargs)
    monkeypatch.setattr(module, "adam_update", update)
    return count


def _counted(units, calls):
    """The units, each ``train`` call appended to ``calls`` as (model, resume)."""
    def wrap(unit):
        def train(run_dir, resume):
            calls.append((unit.model, resume))
            return unit.train(run_dir, resume)
        return unit._replace(train=train)
    return [wrap(u) for u in units]


def test_write_csv_says_its_tier(tmp_path):
    figures.write_csv(tmp_path / "a.csv", [{"name": "x", "n": 1}], ("name", "n"), {"figure": "a"})
    assert figures.read_csv(tmp_path / "a.csv")[1]["tier"] == "figures"
    figures.write_csv(tmp_path / "b.csv", [{"name": "x", "n": 1}], ("name", "n"), {},
                      tier="paper")
    assert "# tier: paper\n" in (tmp_path / "b.csv").read_text()
    with pytest.raises(ValueError, match="tier"):
        figures.write_csv(tmp_path / "c.csv", [], ("name",), {}, tier="quick")


def test_a_figure_of_the_figures_tier_says_figures(tmp_path):
    rows = [{"name": "linear", "step": s, "train_loss": 1.0 / s} for s in (1, 2, 3)]
    _, table = figures.copy_task_loss(rows, tmp_path / "copy_task_loss")
    assert figures.read_csv(table)[1]["tier"] == "figures"


def test_interrupted_tier_resumes_without_repeating_finished_models(tmp_path, monkeypatch):
    steps = COPY["steps"]
    whole = paper.run_units(copy_units(COPY), tmp_path / "whole", echo=lambda line: None)
    # softmax finishes; linear stops after 3 of its updates, past its checkpoint at step 2
    with monkeypatch.context() as m:
        _stop_after(m, model_train, steps + 3)
        with pytest.raises(Interrupted):
            paper.run_units(copy_units(COPY), tmp_path / "broken", echo=lambda line: None)
    assert (tmp_path / "broken/paper_runs/copy/softmax/done.json").exists()
    assert not (tmp_path / "broken/paper_runs/copy/linear/done.json").exists()
    calls, lines = [], []
    with monkeypatch.context() as m:
        count = _stop_after(m, model_train, -1)          # -1: never stop, only count
        resumed = paper.run_units(_counted(copy_units(COPY), calls), tmp_path / "broken",
                                  echo=lines.append)
    assert calls == [("linear", True)]                   # softmax is not trained again
    assert count[0] == steps - 2                         # from linear's checkpoint at 2
    assert "resumed" in lines[0] and "1 of 2 models done" in lines[0]
    for (unit, a), (_, b) in zip(whole.items(), resumed.items()):
        assert a["results"]["eval_loss"] == b["results"]["eval_loss"]
        assert a["results"]["eval_acc"] == b["results"]["eval_acc"]
        want = load_checkpoint(tmp_path / "whole/paper_runs/copy" / unit.model /
                               "checkpoint.npz")
        got = load_checkpoint(tmp_path / "broken/paper_runs/copy" / unit.model /
                              "checkpoint.npz")
        assert got.opt_state.step == want.opt_state.step == steps
        for name in want.params:
            np.testing.assert_array_equal(got.params[name], want.params[name])
            np.testing.assert_array_equal(got.opt_state.m[name], want.opt_state.m[name])
    # a third run finds every model done and trains nothing
    calls.clear()
    paper.run_units(_counted(copy_units(COPY), calls), tmp_path / "broken",
                    echo=lambda line: None)
    assert calls == []


def test_time_left_from_the_finished_models():
    units = copy_units(COPY)
    done = {units[0]: {"train_s": 3.0, "steps": COPY["steps"]}}
    seconds, unmeasured = paper.time_left(units, done)
    assert seconds == pytest.approx(3.0) and unmeasured == []
    assert paper.time_left(units, {}) == (0.0, ["copy"])


def test_fresh_speech_epochs_resume_exactly(tmp_path, monkeypatch):
    task = SpeechTask(n_phonemes=4, n_features=6, min_phonemes=2, max_phonemes=5,
                      min_hold=2, max_hold=4, n_train=8, n_valid=4, n_test=4)
    cfg = speech_setup("linear", task, d_model=8, n_layers=1, n_heads=2, d_mlp=16)
    adam = AdamConfig(lr=1e-2, warmup=2)
    train_cfg = SpeechTrainConfig(epochs=3, batch_size=4, checkpoint_every=1, fresh=True)
    whole, _ = run_speech(cfg, task, train_cfg, adam)
    stale, _ = run_speech(cfg, task, train_cfg._replace(fresh=False), adam)
    assert any(not np.array_equal(whole[k], stale[k]) for k in whole)   # new data was seen
    with monkeypatch.context() as m:
        _stop_after(m, speech_train, 3)                  # mid-epoch 2 of 3
        with pytest.raises(Interrupted):
            run_speech(cfg, task, train_cfg, adam, out_dir=tmp_path)
    resumed, state = run_speech(cfg, task, train_cfg, adam, out_dir=tmp_path, resume=True)
    assert state.step == 6
    for name in whole:
        np.testing.assert_array_equal(resumed[name], whole[name])


@pytest.mark.slow
def test_tiny_tier_end_to_end(tmp_path, capsys):
    assert paper.main(["--out", str(tmp_path), "--config", "tiny"]) == 0
    names = ("copy_task_loss", "image_table", "speech_per")
    for name in names:
        assert (tmp_path / f"{name}.png").exists()
        assert figures.read_csv(tmp_path / f"{name}.csv")[1]["tier"] == "paper"
    assert figures.read_csv(tmp_path / "speech_table.csv")[1]["tier"] == "paper"
    rows, _ = figures.read_csv(tmp_path / "image_table.csv")
    assert [r["name"] for r in rows] == ["softmax", "lsh-1", "lsh-4", "linear"]
    assert all(r["bits_per_dim"] > 0 and r["images_per_s"] > 0 for r in rows)
    assert [r["form"] for r in rows] == ["cache", "recompute", "recompute", "recurrent"]
    assert "make paper" in (tmp_path / "performance.md").read_text()
    done = json.loads((tmp_path / "paper_runs/speech/lsh/done.json").read_text())
    assert done["results"]["epochs"] == 2 and 0 <= done["results"]["test_per"]
    capsys.readouterr()
    assert paper.main(["--out", str(tmp_path), "--config", "tiny", "--only", "copy"]) == 0
    assert "[paper" not in capsys.readouterr().out   # every model done: none trained again


def test_estimate_times_each_model_and_trains_nothing(tmp_path):
    assert paper.main(["--out", str(tmp_path), "--config", "tiny", "--only", "copy,speech",
                       "--estimate", "1"]) == 0
    rows, meta = figures.read_csv(tmp_path / "paper_estimate.csv")
    assert meta["tier"] == "paper" and meta["config"] == "tiny"
    assert [(r["experiment"], r["model"]) for r in rows] == [
        ("copy", a) for a in ("softmax", "linear", "lsh-1", "lsh-4")] + [
        ("speech", m) for m in ("bilstm", "softmax", "lsh", "linear")]
    assert all(r["s_per_step"] > 0 and r["hours"] > 0 for r in rows)
    assert not (tmp_path / "paper_runs").exists()


def test_only_names_known_experiments(capsys):
    with pytest.raises(SystemExit):
        paper.main(["--config", "tiny", "--only", "copy,mnist"])
    assert "copy,mnist" in capsys.readouterr().err
