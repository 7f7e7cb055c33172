"""Training end to end: a tiny run whose loss falls, evaluation, the loss-curve CSV and the
command line (train, generate)."""
import csv

import numpy as np
import pytest

from linattn.__main__ import main
from linattn.model.optim import AdamConfig
from linattn.model.train import (TrainConfig, copy_setup, copy_task_curves, evaluate,
                                 held_out_batches, read_log, run)

TINY = dict(length=3, d_model=16, n_layers=1, n_heads=2, d_mlp=32)


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["linear", "softmax"])
def test_tiny_training_run_lowers_the_loss(attention):
    task, cfg = copy_setup(attention, **TINY)
    train_cfg = TrainConfig(steps=120, batch_size=16, eval_batches=2)
    from linattn.model.transformer import init_params
    held_out = held_out_batches(task, train_cfg)
    before, _ = evaluate(init_params(cfg, train_cfg.seed), cfg, held_out)
    params, state = run(cfg, task, train_cfg, AdamConfig(lr=3e-3, warmup=10))
    after, accuracy = evaluate(params, cfg, held_out)
    assert state.step == 120
    assert after < 0.75 * before and accuracy > 0.2        # chance accuracy is 0.1


@pytest.mark.slow
def test_tiny_lsh_model_trains():
    # shared QK, chunks of 2 over a sequence of 8, two rounds: the loss falls in a few steps
    task, cfg = copy_setup("lsh", **TINY, n_hashes=2, lsh_chunk_size=2)
    train_cfg = TrainConfig(steps=30, batch_size=16, eval_batches=2)
    from linattn.model.transformer import init_params
    held_out = held_out_batches(task, train_cfg)
    before, _ = evaluate(init_params(cfg, train_cfg.seed), cfg, held_out)
    params, state = run(cfg, task, train_cfg, AdamConfig(lr=3e-3, warmup=5))
    after, _ = evaluate(params, cfg, held_out)
    assert state.step == 30 and np.isfinite(after) and after < 0.9 * before


@pytest.mark.slow
def test_copy_task_curves_writes_both_attentions(tmp_path):
    path = copy_task_curves(tmp_path, train_cfg=TrainConfig(steps=3, batch_size=2,
                                                           eval_every=3, eval_batches=1),
                            **TINY)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["attention"] for r in rows] == ["linear"] * 3 + ["softmax"] * 3
    assert rows[-1]["eval_loss"] and float(rows[-1]["train_loss"]) > 0
    mtime = (tmp_path / "linear" / "log.csv").stat().st_mtime_ns
    copy_task_curves(tmp_path, train_cfg=TrainConfig(steps=3, batch_size=2, eval_every=3,
                                                     eval_batches=1), **TINY)
    assert (tmp_path / "linear" / "log.csv").stat().st_mtime_ns == mtime   # reused


@pytest.mark.slow
def test_command_line_train_resume_generate(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "copy", "--length", "3", "--d-model", "8", "--n-layers", "1",
            "--n-heads", "2", "--d-mlp", "16", "--batch-size", "4", "--eval-every", "2",
            "--checkpoint-every", "2", "--out", str(out), "--quiet"]
    assert main(args + ["--steps", "2"]) == 0
    assert main(args + ["--steps", "4", "--resume"]) == 0
    np.testing.assert_array_equal(read_log(out / "log.csv")["step"], [1, 2, 3, 4])
    samples = tmp_path / "s.txt"
    assert main(["generate", "--checkpoint", str(out / "checkpoint.npz"), "--n", "5",
                 "--temperature", "0", "--out", str(samples)]) == 0
    lines = samples.read_text().splitlines()
    assert len(lines) == 5 and all("->" in line for line in lines)
    assert "copy accuracy" in capsys.readouterr().err


@pytest.mark.slow
def test_command_line_digits_png(tmp_path, capsys):
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    out = tmp_path / "d"
    assert main(["train", "digits", "--d-model", "8", "--n-layers", "1", "--n-heads", "2",
                 "--d-mlp", "16", "--steps", "1", "--batch-size", "2", "--out", str(out),
                 "--quiet"]) == 0
    png = tmp_path / "digits.png"
    assert main(["generate", "--checkpoint", str(out / "checkpoint.npz"), "--n", "4",
                 "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "bits/dim" in capsys.readouterr().err


def test_resume_of_another_model_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    base = ["train", "copy", "--length", "3", "--d-model", "8", "--n-layers", "1",
            "--n-heads", "2", "--d-mlp", "16", "--steps", "1", "--out", str(out), "--quiet"]
    assert main(base) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:          # one line naming the field, exit 2
        main(base[:4] + ["--d-model", "16"] + base[6:] + ["--resume"])
    assert info.value.code == 2
    assert "d_model 8 (checkpoint) vs 16 (options)" in capsys.readouterr().err


def test_resume_needs_an_output_directory():
    task, cfg = copy_setup("linear", **TINY)
    with pytest.raises(ValueError, match="out_dir"):
        run(cfg, task, TrainConfig(steps=1), resume=True)
