"""Measurements behind the figures: feature maps against softmax, and copy-task loss curves."""
import numpy as np

from linattn.lab import measure
from linattn.model import load_checkpoint


def test_feature_map_error_measures_favor_converging():
    rows = measure.feature_map_error_rows(n_features=(4, 1024), seeds=range(2), n=16)
    favor = {f: np.median([r["kernel_error"] for r in rows
                           if r["name"] == "favor" and r["n_features"] == f]) for f in (4, 1024)}
    assert favor[1024] < 0.5 * favor[4]
    assert {r["name"] for r in rows} == {"favor", "taylor", "elu+1", "relu"}


def test_copy_task_rows_train_both_attentions(tmp_path):
    tiny = dict(length=3, d_model=16, n_layers=1, n_heads=2, d_mlp=32)
    rows = measure.copy_task_rows(tmp_path, steps=4, batch_size=4, eval_every=2, **tiny)
    assert [(r["name"], r["step"]) for r in rows] == [
        (name, s) for name in ("linear", "softmax") for s in (1, 2, 3, 4)]
    assert [r["eval_loss"] is None for r in rows[:4]] == [True, False, True, False]
    assert all(r["train_loss"] > 0 and r["elapsed_s"] >= 0 for r in rows)
    for name in ("linear", "softmax"):       # each run leaves its checkpoint for generation
        ckpt = load_checkpoint(tmp_path / name / "checkpoint.npz")
        assert ckpt.opt_state.step == 4 and ckpt.config.attention == name
    again = measure.copy_task_rows(tmp_path, steps=4, batch_size=4, eval_every=2, **tiny)
    assert [r["train_loss"] for r in again] == [r["train_loss"] for r in rows]  # deterministic
