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


def test_train_step_head_to_head_runs_the_step_in_its_mode(tmp_path, monkeypatch):
    """One subprocess of ``python -m linattn.lab.bench.train_step`` per call, in the
    instruction-set mode asked for, with arguments its parser takes."""
    import subprocess
    import sys

    from linattn.lab import isa
    from linattn.lab.bench import train_step
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda args, **kw: calls.append((args, kw)))
    path = tmp_path / "avx2" / "train_step.json"
    for mode, peer in (("native", None), ("avx2", sys.executable)):
        assert measure.train_step_head_to_head(path, mode, peer, rounds=1) == path
    assert path.parent.is_dir()                        # the folder exists for --out
    for (args, kw), mode in zip(calls, ("native", "avx2")):
        assert args[:3] == [sys.executable, "-m", "linattn.lab.bench.train_step"]
        assert kw["check"] and isa.mode(kw["env"]) == mode
        cfg = train_step.parse(args[3:])
        assert cfg.batch == [measure.TRAIN_STEP["batch"]] and cfg.rounds == 1
        assert cfg.out == str(path)
    assert "--no-peers" in calls[0][0] and train_step.parse(calls[1][0][3:]).peer_python == \
        sys.executable


def test_avx2_generation_runs_the_rnn_table_in_avx2_mode(tmp_path, monkeypatch):
    import subprocess
    import sys

    from linattn.lab import isa
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda args, **kw: calls.append((args, kw)))
    path = tmp_path / "generation_speed.csv"
    for peer in (None, sys.executable):
        assert measure.avx2_generation(path, peer, rounds=2) == path
    for args, kw in calls:
        assert args[:4] == [sys.executable, "-m", "linattn.lab.speed", "--rnn-only"]
        assert kw["check"] and isa.mode(kw["env"]) == "avx2"
        assert args[args.index("--batch") + 1:args.index("--batch") + 3] == ["1", "16"]
        assert args[args.index("--rounds") + 1] == "2" and args[args.index("--csv") + 1] == \
            str(path)
    assert "--peer-python" not in calls[0][0]
    assert calls[1][0][calls[1][0].index("--peer-python") + 1] == sys.executable
