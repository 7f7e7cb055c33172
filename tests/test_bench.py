"""``python -m linattn.bench --quick``: runs, writes its files, and reports every target."""
import json

from linattn.__main__ import main


def test_quick_bench_writes_results(tmp_path, capsys):
    assert main(["bench", "--quick", "--no-peers", "--no-progress", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "bench.json").read_text())
    assert results["machine"]["cpu"] and results["ceiling_gflops"] > 0
    cases = {row["case"] for row in results["scaling"]}
    assert {"softmax numpy", "causal numba", "causal numpy chunked"} <= cases
    for row in results["scaling"]:
        assert row["forward_s"] > 0 and row["forward_backward_s"] > 0
    # linear memory: 8x the positions, at most ~9x the bytes; softmax's grows faster
    memory = {(r["case"], r["n"]): r["peak_extra_bytes"] for r in results["scaling"]}
    assert memory["causal numba", 1024] < 9 * memory["causal numba", 128]
    assert memory["softmax numpy", 1024] > 20 * memory["softmax numpy", 128]
    assert len(results["targets"]) == 8
    for name in ("bench_scaling.csv", "bench_generation.csv", "bench_crossover.csv",
                 "bench.txt"):
        assert (tmp_path / name).stat().st_size > 0
    assert "targets" in capsys.readouterr().out
