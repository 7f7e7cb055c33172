"""Speech training end to end on tiny SYNTHETIC data: resuming equals an unbroken run, the
loss falls, the curves and Table-3-style CSVs, and the command line."""
import csv

import numpy as np
import pytest

from linattn.__main__ import main
from linattn.model.checkpoint import load_checkpoint
from linattn.model.speech.models import init_params, loss_and_grads
from linattn.model.speech.task import SpeechTask, pad_batch
from linattn.model.speech import train as speech_train
from linattn.model.optim import AdamConfig
from linattn.model.speech.train import (SpeechTrainConfig, read_speech_log, run_speech,
                                        speech_curves, speech_setup)

TASK = SpeechTask(n_phonemes=4, n_features=6, min_phonemes=2, max_phonemes=5, min_hold=2,
                  max_hold=4, n_train=12, n_valid=4, n_test=4)
SIZES = dict(d_model=8, n_layers=1, n_heads=2, d_mlp=16, hidden=6, lstm_layers=1)
ADAM = AdamConfig(lr=1e-2, warmup=5)


def test_resume_equals_an_unbroken_run(tmp_path, monkeypatch):
    cfg = speech_setup("bilstm", TASK, **SIZES)
    whole, _ = run_speech(cfg, TASK, SpeechTrainConfig(epochs=2, batch_size=5), ADAM)
    out = tmp_path / "run"
    # 3 batches an epoch, a checkpoint every 2 steps: crash in the first validation, so the
    # last checkpoint is mid-epoch (step 2), then resume
    def crash(*args):
        raise RuntimeError("crash")

    with monkeypatch.context() as m:
        m.setattr(speech_train, "evaluate_per", crash)
        with pytest.raises(RuntimeError, match="crash"):
            run_speech(cfg, TASK, SpeechTrainConfig(epochs=2, batch_size=5, checkpoint_every=2),
                       ADAM, out_dir=out)
    assert load_checkpoint(out / "checkpoint.npz").opt_state.step == 2
    resumed, state = run_speech(cfg, TASK, SpeechTrainConfig(epochs=2, batch_size=5), ADAM,
                                out_dir=out, resume=True)
    assert state.step == 6
    for name in whole:
        np.testing.assert_array_equal(resumed[name], whole[name])
    log = read_speech_log(out / "log.csv")
    np.testing.assert_array_equal(log["epoch"], [1, 2])
    np.testing.assert_array_equal(log["step"], [3, 6])
    assert np.all(log["epoch_s"] > 0) and np.all(log["valid_per"] >= 0)


def test_training_lowers_the_loss():
    cfg = speech_setup("bilstm", TASK, **SIZES)
    batch = pad_batch(TASK.split("train"))
    before, _ = loss_and_grads(init_params(cfg), cfg, batch)
    params, _ = run_speech(cfg, TASK, SpeechTrainConfig(epochs=8, batch_size=4), ADAM)
    after, _ = loss_and_grads(params, cfg, batch)
    assert after < 0.7 * before


def test_speech_curves_and_table(tmp_path):
    models = ("bilstm", "linear")
    train_cfg = SpeechTrainConfig(epochs=2, batch_size=6)
    curves, table = speech_curves(tmp_path, models, TASK, train_cfg, ADAM, **SIZES)
    with open(curves, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["model"], r["epoch"]) for r in rows] == [(m, e) for m in models for e in "12"]
    with open(table, newline="") as f:
        table_rows = list(csv.DictReader(f))
    assert [r["model"] for r in table_rows[:2]] == list(models)
    assert table_rows[2]["model"] == "empty output" and float(table_rows[2]["test_per"]) == 1
    assert all(float(r["test_per"]) >= 0 and float(r["s_per_epoch"]) > 0
               for r in table_rows[:2])
    mtime = (tmp_path / "linear" / "log.csv").stat().st_mtime_ns
    speech_curves(tmp_path, models, TASK, train_cfg, ADAM, **SIZES)
    assert (tmp_path / "linear" / "log.csv").stat().st_mtime_ns == mtime   # reused


def test_command_line_train_resume(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "speech", "--model", "linear", "--d-model", "8", "--n-layers", "1",
            "--n-heads", "2", "--d-mlp", "16", "--n-train", "6", "--n-valid", "2",
            "--n-test", "2", "--min-phonemes", "2", "--max-phonemes", "4",
            "--batch-size", "3", "--out", str(out), "--quiet"]
    assert main(args + ["--epochs", "1"]) == 0
    assert main(args + ["--epochs", "2", "--resume"]) == 0
    err = capsys.readouterr().err
    assert "SYNTHETIC" in err and "epoch 2/2: train loss" in err and "test PER" in err
    assert "valid PER" in err and "s/epoch" in err
    ckpt = load_checkpoint(out / "checkpoint.npz")
    assert ckpt.config.model == "linear" and ckpt.opt_state.step == 4
    np.testing.assert_array_equal(read_speech_log(out / "log.csv")["epoch"], [1, 2])
    with pytest.raises(SystemExit) as refused:
        main(["generate", "--checkpoint", str(out / "checkpoint.npz")])
    assert refused.value.code == 2 and "speech" in capsys.readouterr().err
