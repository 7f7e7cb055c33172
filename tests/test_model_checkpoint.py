"""Checkpoints: exact round trip, atomic writes, clear errors for bad files, and training
that resumes exactly where it stopped."""
import os

import numpy as np
import pytest

from linattn.model import checkpoint
from linattn.model.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from linattn.model.config import ModelConfig
from linattn.model.optim import AdamConfig, adam_init
from linattn.model.tasks import CopyTask
from linattn.model.train import TrainConfig, read_log, run, train_step
from linattn.model.transformer import init_params

TASK = CopyTask(length=3)
CFG = ModelConfig(vocab_size=TASK.vocab_size, max_len=TASK.seq_len, d_model=8, n_layers=1,
                  n_heads=2, d_mlp=16)
TRAIN = TrainConfig(steps=6, batch_size=4, seed=3, eval_every=3, eval_batches=1,
                    checkpoint_every=2)
ADAM = AdamConfig(lr=1e-2, warmup=2)


@pytest.fixture
def trained():
    """Parameters and Adam state after two real updates (non-zero moments)."""
    params, state = init_params(CFG, 0), adam_init(init_params(CFG, 0))
    for _ in range(2):
        params, state, _, _ = train_step(params, state, CFG, ADAM, TASK, TRAIN)
    return params, state


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_round_trip_is_exact(tmp_path, trained):
    params, state = trained
    path = tmp_path / "c.npz"
    save_checkpoint(path, CFG, params, state, meta={"task": "copy"})
    ckpt = load_checkpoint(path, expect=CFG)
    assert ckpt.config == CFG and ckpt.opt_state.step == 2 and ckpt.meta == {"task": "copy"}
    _assert_same(ckpt.params, params)
    _assert_same(ckpt.opt_state.m, state.m)
    _assert_same(ckpt.opt_state.v, state.v)


def test_crash_mid_save_keeps_the_last_good_checkpoint(tmp_path, trained, monkeypatch):
    params, state = trained
    path = tmp_path / "c.npz"
    save_checkpoint(path, CFG, params, state)

    def crash(f, **arrays):
        f.write(b"PK\x03\x04 half a zip file")
        raise KeyboardInterrupt                     # e.g. the user stops the run

    monkeypatch.setattr(checkpoint.np, "savez", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, CFG, {n: p + 1 for n, p in params.items()}, state)
    monkeypatch.undo()
    _assert_same(load_checkpoint(path).params, params)
    assert os.listdir(tmp_path) == ["c.npz"]        # no temporary file left behind


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "not_npz"])
def test_damaged_file_gives_a_clear_error(tmp_path, trained, damage):
    path = tmp_path / "c.npz"
    save_checkpoint(path, CFG, *trained)
    data = path.read_bytes()
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":                          # corrupt bytes inside a stored array
        i = data.index(b"param/tok_emb") + 400
        data = data[:i] + bytes(255 - c for c in data[i:i + 8]) + data[i + 8:]
    elif damage == "empty":
        data = b""
    else:
        data = b"step,loss\n1,2.3\n"
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match="c.npz"):
        load_checkpoint(path)


def test_mismatched_config_is_named(tmp_path, trained):
    path = tmp_path / "c.npz"
    save_checkpoint(path, CFG, *trained)
    with pytest.raises(CheckpointError, match="d_model"):
        load_checkpoint(path, expect=CFG._replace(d_model=16))


@pytest.mark.parametrize("edit, match", [
    (lambda a: a.pop("param/lnf_g"), "missing"),
    (lambda a: a.update({"adam_m/w_out": np.zeros((3, 3), np.float32)}), "adam_m/w_out"),
    (lambda a: a.update({"param/b_out": a["param/b_out"].astype(np.float64)}), "float64"),
    (lambda a: a.update({"format": np.array("something-else")}), "format"),
    (lambda a: a.update({"config": np.array('{"d_model": 8}')}), "config"),
    (lambda a: a.pop("step"), "step"),
])
def test_inconsistent_contents_are_named(tmp_path, trained, edit, match):
    path = tmp_path / "c.npz"
    save_checkpoint(path, CFG, *trained)
    with np.load(path) as data:
        arrays = {n: data[n] for n in data.files}
    edit(arrays)
    np.savez(path, **arrays)
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(path)


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "nothing.npz")


def test_resume_continues_exactly(tmp_path):
    straight, _ = run(CFG, TASK, TRAIN, ADAM, out_dir=tmp_path / "a")
    run(CFG, TASK, TRAIN._replace(steps=4), ADAM, out_dir=tmp_path / "b")
    resumed, state = run(CFG, TASK, TRAIN, ADAM, out_dir=tmp_path / "b", resume=True)
    assert state.step == TRAIN.steps
    _assert_same(resumed, straight)
    _assert_same(load_checkpoint(tmp_path / "b" / "checkpoint.npz").params, straight)
    a, b = read_log(tmp_path / "a" / "log.csv"), read_log(tmp_path / "b" / "log.csv")
    np.testing.assert_array_equal(b["step"], np.arange(1, 7))
    np.testing.assert_array_equal(b["train_loss"], a["train_loss"])


def test_resume_drops_log_rows_written_after_the_checkpoint(tmp_path):
    out = tmp_path / "r"
    run(CFG, TASK, TRAIN._replace(steps=3), ADAM, out_dir=out)   # checkpoint at 2 and 3
    save_checkpoint(out / "checkpoint.npz", CFG, *run(CFG, TASK, TRAIN._replace(steps=2), ADAM))
    run(CFG, TASK, TRAIN._replace(steps=4), ADAM, out_dir=out, resume=True)
    np.testing.assert_array_equal(read_log(out / "log.csv")["step"], [1, 2, 3, 4])


def test_config_saved_before_the_causal_field_loads_as_causal():
    import json
    fields = json.loads(CFG.to_json())
    del fields["causal"]
    assert ModelConfig.from_json(json.dumps(fields)) == CFG and CFG.causal


def test_speech_config_round_trip_and_type_check(tmp_path):
    from linattn.model.speech.models import SpeechConfig
    from linattn.model.speech.models import init_params as speech_init
    cfg = SpeechConfig(model="bilstm", n_features=3, n_classes=4, hidden=3, lstm_layers=1)
    params = speech_init(cfg)
    path = tmp_path / "speech.npz"
    save_checkpoint(path, cfg, params, adam_init(params), {"task": "speech"})
    ckpt = load_checkpoint(path, expect=cfg)
    assert ckpt.config == cfg and ckpt.meta == {"task": "speech"}
    for name in params:
        np.testing.assert_array_equal(ckpt.params[name], params[name])
    with pytest.raises(CheckpointError, match="holds a SpeechConfig, expected a ModelConfig"):
        load_checkpoint(path, expect=CFG)
