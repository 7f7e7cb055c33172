"""The command line as a careless user meets it: every bad value of every flag that takes
one is refused before any work with one line on stderr naming the flag, exit status 2, no
traceback, and nothing written or overwritten."""
import os
import subprocess
import sys

import pytest

from linattn.__main__ import main
from linattn.lab.bench import gpu, lsh_peer, train_step
from linattn.model.checkpoint import save_checkpoint
from linattn.model.optim import adam_init
from linattn.model.train import copy_setup
from linattn.model.transformer import init_params

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MISSING = os.path.join("nowhere", "checkpoint.npz")

# (entry point, argv, the text the one line must contain: the flag, or what it names)
BAD = [
    *[(main, ["train", "copy", *args, "--out", "run"], flag) for args, flag in [
        (["--steps", "0"], "--steps"), (["--steps", "-5"], "--steps"),
        (["--steps", "ten"], "--steps"), (["--batch-size", "0"], "--batch-size"),
        (["--lr", "-1"], "--lr"), (["--lr", "0"], "--lr"), (["--lr", "nan"], "--lr"),
        (["--length", "0"], "--length"), (["--eval-every", "0"], "--eval-every"),
        (["--checkpoint-every", "0"], "--checkpoint-every"), (["--d-model", "0"], "--d-model"),
        (["--n-layers", "-1"], "--n-layers"), (["--n-heads", "x"], "--n-heads"),
        (["--d-mlp", "0"], "--d-mlp"), (["--warmup", "-1"], "--warmup"),
        (["--clip", "-1"], "--clip"), (["--seed", "-1"], "--seed"),
        (["--attention", "cosine"], "--attention"), (["--feature-map", "exp"], "--feature-map"),
        (["--positions", "rotary"], "--positions"), (["--path", "fast"], "--path"),
        (["--d-model", "30", "--n-heads", "4"], "d_model"),
        (["--resume", "--d-model", "32"], "d_model"),            # the run's model differs
    ]],
    (main, ["train", "digits", "--length", "5", "--out", "run"], "--length"),
    (main, ["train", "digits", "--paper", "--out", "run"], "--paper"),
    (main, ["train", "copy", "--resume", "--out", "empty"], "no checkpoint at"),
    (main, ["train", "copy", "--resume", "--out", "corrupt"], "--resume"),
    (main, ["train", "copy", "--out", "run/log.csv"], "--out"),
    (main, ["train", "chess"], "task"),
    *[(main, ["train", "speech", *args, "--out", "run"], flag) for args, flag in [
        (["--epochs", "0"], "--epochs"), (["--batch-size", "0"], "--batch-size"),
        (["--lr", "-1"], "--lr"), (["--noise", "-1"], "--noise"),
        (["--n-train", "0"], "--n-train"), (["--d-model", "0"], "--d-model"),
        (["--min-phonemes", "50", "--max-phonemes", "10"], "--min-phonemes"),
        (["--model", "gru"], "--model"), (["--data-seed", "-2"], "--data-seed"),
        (["--checkpoint-every", "0"], "--checkpoint-every"),
        (["--resume"], "--resume"),                    # a speech run: no speech checkpoint
    ]],
    *[(main, ["generate", *args], flag) for args, flag in [
        (["--checkpoint", "run/checkpoint.npz", "--n", "0"], "--n"),
        (["--checkpoint", "run/checkpoint.npz", "--n", "-3"], "--n"),
        (["--checkpoint", "run/checkpoint.npz", "--n", "many"], "--n"),
        (["--checkpoint", "run/checkpoint.npz", "--temperature", "-1"], "--temperature"),
        (["--checkpoint", "run/checkpoint.npz", "--seed", "-1"], "--seed"),
        (["--checkpoint", "run/checkpoint.npz", "--method", "beam"], "--method"),
        (["--checkpoint", "run/checkpoint.npz", "--out", "nowhere/s.txt"], "--out"),
        (["--checkpoint", MISSING], "no checkpoint at"),
        (["--checkpoint", "run"], "--checkpoint"),                # a directory
        (["--checkpoint", "corrupt/checkpoint.npz"], "--checkpoint"),
        (["--checkpoint", "run/log.csv"], "--checkpoint"),        # not a checkpoint at all
        ([], "--checkpoint"),
    ]],
    *[(main, ["bench", *args, "--out", "bench"], flag) for args, flag in [
        (["--batch", "0"], "--batch"), (["--heads", "-1"], "--heads"),
        (["--dim", "x"], "--dim"), (["--min-n", "0"], "--min-n"),
        (["--min-n", "512", "--max-n", "128"], "--min-n"), (["--tokens", "0"], "--tokens"),
        (["--rounds", "0"], "--rounds"), (["--repeats", "0"], "--repeats"),
        (["--budget", "0"], "--budget"), (["--pause", "-1"], "--pause"),
        (["--dtype", "float16"], "--dtype"), (["--cases", "fastest"], "--cases"),
        (["--widths", "0"], "--widths"), (["--peer-python", "/no/python"], "--peer-python"),
        (["--no-peers", "--peer-python", sys.executable], "--peer-python"),
    ]],
    (main, ["bench", "--out", "run/log.csv"], "--out"),
    (main, ["figures", "--peer-python", "/no/python", "--out", "figs"], "--peer-python"),
    (main, ["figures", "--out", "run/log.csv"], "--out"),
    *[(main, ["speed", *args], flag) for args, flag in [
        (["--batch", "0"], "--batch"), (["--rounds", "0"], "--rounds"),
        (["--budget", "-1"], "--budget"), (["--peer-python", "/no/python"], "--peer-python"),
        (["--csv", "run"], "--csv"),
    ]],
    (main, ["warmup", "--dtypes", "float16"], "--dtypes"),
    (main, ["warmup", "--families", "rnn"], "--families"),
    (main, ["nonsense"], "nonsense"),
    *[(train_step.main, args, flag) for args, flag in [
        (["--rounds", "0"], "--rounds"), (["--batch", "0"], "--batch"),
        (["--threads", "0"], "--threads"), (["--pause", "-1"], "--pause"),
        (["--d-model", "0"], "--d-model"), (["--out", "nowhere/x.json"], "--out"),
        (["--no-peers", "--peer-python", sys.executable], "--peer-python"),
    ]],
    *[(lsh_peer.main, args, flag) for args, flag in [
        (["--n", "0"], "--n"), (["--chunk-size", "0"], "--chunk-size"),
        (["--n-hashes", "0"], "--n-hashes"), (["--n-buckets", "3"], "--n-buckets"),
        (["--threads", "0"], "--threads"), (["--scaling", "5", "3"], "--scaling"),
        (["--peer-python", "/no/python"], "--peer-python"),
    ]],
    *[(gpu.main, args, flag) for args, flag in [
        (["--heads", "0"], "--heads"), (["--budget-s", "0"], "--budget-s"),
        (["--max-log2-n", "-1"], "--max-log2-n"), (["--peak-gbs", "-5"], "--peak-gbs"),
        (["--json", "nowhere/x.json"], "--json"),
    ]],
]


def _snapshot(root):
    """{relative path: bytes} of every file under ``root``, and every directory."""
    files = {}
    for folder, dirs, names in os.walk(root):
        for name in dirs:
            files[os.path.relpath(os.path.join(folder, name), root)] = None
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, root)] = f.read()
    return files


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A working directory with a finished copy run (run/checkpoint.npz, run/log.csv), an
    empty run directory and a corrupt checkpoint."""
    _, cfg = copy_setup("linear")
    params = init_params(cfg, 0)
    (tmp_path / "run").mkdir()
    save_checkpoint(tmp_path / "run" / "checkpoint.npz", cfg, params, adam_init(params),
                    meta={"train_args": {"task": "copy", "attention": "linear",
                                         "feature_map": "elu+1", "positions": "learned",
                                         "paper": False, "fixed_length": False}})
    (tmp_path / "run" / "log.csv").write_text("step,tokens\n1,32\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "checkpoint.npz").write_bytes(b"PK\x03\x04 truncated")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("entry, argv, flag", BAD, ids=lambda x: " ".join(x)
                         if isinstance(x, list) else None)
def test_a_bad_invocation_is_one_line_exit_2_and_writes_nothing(user_dir, capsys, entry,
                                                                  argv, flag):
    before = _snapshot(user_dir)
    with pytest.raises(SystemExit) as exit_info:
        entry(argv)
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert err.endswith("\n") and err.count("\n") == 1, err     # one line
    assert flag in err and "Traceback" not in err, err
    assert out == ""
    assert _snapshot(user_dir) == before                         # nothing written


def test_resume_names_every_field_that_differs(user_dir, capsys):
    with pytest.raises(SystemExit):
        main(["train", "copy", "--resume", "--out", "run", "--d-model", "32", "--n-layers", "3"])
    err = capsys.readouterr().err
    assert "d_model 64 (checkpoint) vs 32 (options)" in err and "n_layers" in err
    assert "d_mlp" not in err


def test_the_checks_do_not_refuse_good_values(user_dir):
    """A test that cannot fail is a defect: the parsers accept what they should (parse
    only; nothing is trained)."""
    from linattn.lab.bench import parse
    cfg = parse(["--no-peers", "--batch", "2", "--pause", "0", "--out", "bench"])
    assert cfg.batch == 2 and cfg.pause == 0.0 and cfg.no_peers
    assert train_step.parse(["--no-peers", "--rounds", "1"]).rounds == 1


@pytest.mark.parametrize("argv, flag", [
    (["generate", "--checkpoint", MISSING, "--n", "0"], "--n"),
    (["generate", "--checkpoint", MISSING], "no checkpoint at"),
    (["train", "copy", "--steps", "0"], "--steps"),
])
def test_python_m_linattn_exits_2_with_one_line(tmp_path, argv, flag):
    env = {**os.environ, "PYTHONPATH": ROOT}
    run = subprocess.run([sys.executable, "-m", "linattn", *argv], capture_output=True,
                         text=True, cwd=tmp_path, env=env, timeout=300)
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and flag in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and os.listdir(tmp_path) == []
