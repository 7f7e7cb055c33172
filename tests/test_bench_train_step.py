"""``python -m linattn.lab.bench.train_step`` at a tiny shape: it runs, takes its rounds and
reports (its speed is what it measures, never asserted here)."""
import importlib.util
import json
import sys

import pytest

from linattn.lab.bench import train_step

TINY = ["--batch", "2", "3", "--rounds", "2", "--repeats", "1", "--pause", "0",
        "--length", "3", "--d-model", "8", "--n-layers", "1", "--n-heads", "2", "--d-mlp", "16"]


def test_runs_without_peers_and_reports(tmp_path, capsys):
    out = tmp_path / "step.json"
    assert train_step.main(TINY + ["--no-peers", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "batch  ours s/step  pft s/step  pft/ours" in text
    assert "machine:" in text and "BLAS" in text and "threads" in text
    result = json.loads(out.read_text())
    assert [row["batch"] for row in result["rows"]] == [2, 3]
    for row in result["rows"]:
        assert len(row["ours_rounds_s"]) == 2 and row["ours_s"] > 0
        assert row["pft_s"] is None and row["pft_rounds_s"] == []
    assert result["seq_len"] == 7 and result["model"]["d_model"] == 8


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None,
                    reason="this interpreter has torch: it would run the peer")
def test_an_interpreter_without_the_peers_is_skipped_with_a_note(capsys):
    # the table says so and still shows our side
    assert train_step.main(TINY + ["--peer-python", sys.executable, "--batch", "2"]) == 0
    text = capsys.readouterr().out
    assert "none ran: no torch" in text
    assert text.rstrip().splitlines()[-1].split()[2:] == ["-", "-"]


def test_records_the_instruction_set_of_each_side(tmp_path, capsys, monkeypatch):
    from linattn.lab import isa
    for name in isa.AVX2_ENVIRONMENT:                   # this process runs natively
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "step.json"
    assert train_step.main(TINY + ["--batch", "2", "--rounds", "1", "--no-peers",
                                   "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["machine"]["instruction_set"]["mode"] in ("native", "avx2")
    assert "peer_cpu_capability" in result and result["peer_cpu_capability"] is None
    assert "instruction set: ours native (numba" in capsys.readouterr().out
