"""The lab's benchmark: ``python -m linattn.lab.bench --quick`` runs, writes its files and
reports what it measured; its timing helpers (``timing``) and how the scaling calls them."""
import json
import time

import pytest

from linattn.__main__ import main
from linattn.lab.bench import timing


@pytest.mark.slow
def test_quick_bench_writes_results(tmp_path, capsys):
    assert main(["bench", "--quick", "--no-peers", "--no-progress", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "bench.json").read_text())
    assert results["machine"]["cpu"] and results["ceiling_gflops"] > 0
    described = results["machine"]["instruction_set"]          # the mode this process ran
    assert described["mode"] == "native" and described["numba_cpu"]
    cases = {row["case"] for row in results["scaling"]}
    assert {"softmax numpy", "causal numba", "causal numpy chunked"} <= cases
    for row in results["scaling"]:
        assert row["forward_s"] > 0 and row["forward_backward_s"] > 0
    # linear memory: 8x the positions, at most ~9x the bytes; softmax's grows faster
    memory = {(r["case"], r["n"]): r["peak_extra_bytes"] for r in results["scaling"]}
    assert memory["causal numba", 1024] < 9 * memory["causal numba", 128]
    assert memory["softmax numpy", 1024] > 20 * memory["softmax numpy", 128]
    quantities = [q for q, _ in results["summary"]]
    assert any("pft causal linear / causal numba" in q for q in quantities)   # None: no peers
    assert any("peak extra memory" in q for q in quantities)
    fraction = dict(results["summary"])[
        f"softmax numba forward N={results['config']['compare_n']}: fraction of float32 "
        f"matmul GFLOP/s"]
    assert 0 < fraction < 2                  # products at most about the ceiling's speed
    assert len(results["head_to_head"]) == 2                 # --quick's rounds, no peers
    for r in results["head_to_head"]:
        assert min(r["ceiling_gflops"], r["forward_s"], r["forward_backward_s"],
                   r["step_s"], r["recurrence_step_s"], r["state_pass_s"]) > 0
        assert r["pft_step_s"] is None
    threads = results["threads"]             # threadpoolctl is a dependency: the yardstick ran
    assert all(threads[k] > 0 for k in ("all_s", "one_s", "blas_all_s", "blas_one_s"))
    from linattn.lab.bench.cases import AUTO_RULES       # the forms "auto" chooses between
    timed = {(r["case"], r["n"]) for r in results["auto_rules"]}
    assert timed == {(c, n) for c in AUTO_RULES for n in (64, results["config"]["cross_n"])}
    assert all(r["forward_backward_s"] > 0 for r in results["auto_rules"])
    for name in ("bench_scaling.csv", "bench_generation.csv", "bench_crossover.csv",
                 "bench_auto_rules.csv", "bench.txt"):
        assert (tmp_path / name).stat().st_size > 0
    output = capsys.readouterr().out
    assert "summary" in output and "Recurrence.step / floor" in output
    assert "instruction set: native (numba " in output
    for word in ("target", "goal", " met"):
        assert word not in output


def test_bench_rejects_no_rounds():
    with pytest.raises(SystemExit):
        main(["bench", "--rounds", "0"])
    with pytest.raises(SystemExit):
        main(["bench", "--isa", "sse"])


def test_bench_refuses_the_avx2_mode_on_a_cpu_without_avx2(monkeypatch):
    from linattn.lab import bench, isa
    monkeypatch.setattr(isa, "cpu_flags", lambda: ())
    with pytest.raises(SystemExit, match="reports no AVX2"):
        bench.main(["--isa", "avx2"])


def test_interleaved_takes_calls_in_turn_each_after_an_untimed_one():
    log = []
    slow_once = iter([0.05])                 # only the first call of "a" is slow

    def call(name):
        log.append(name)
        time.sleep(next(slow_once, 0.0) if name == "a" else 0.0)

    calls = {name: (lambda n=name: log.append("set " + n), lambda n=name: call(n))
             for name in ("a", "b")}
    best = timing.interleaved(calls, rounds=3)
    assert log == ["set a", "a", "a", "set b", "b", "b"] * 3
    assert set(best) == {"a", "b"} and best["a"] < 0.05


def test_medians_in_turn_alternates_the_two_sides_and_takes_each_median():
    seen = []

    def side(name, times):
        times = iter(times)
        return lambda: seen.append(name) or next(times)
    ours, theirs = timing.medians_in_turn(side("ours", [3.0, 1.0, 2.0]),
                                          side("theirs", [9, 7, 8]), rounds=3)
    assert seen == ["ours", "theirs"] * 3 and (ours, theirs) == (2.0, 8.0)


def test_the_peers_script_imports_without_linattn(tmp_path):
    """``peers.py`` runs in the peers' interpreter, which has no linattn: it finds its sibling
    ``timing`` through its own folder, so neither may import from the package at load time."""
    import pathlib
    import subprocess
    import sys

    folder = pathlib.Path(timing.__file__).parent
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); sys.modules['linattn'] = None; "
             "import timing, peers")
    run = subprocess.run([sys.executable, "-c", probe, str(folder)], capture_output=True,
                         text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr


def test_blas_is_named_with_the_package_that_ships_it():
    # NumPy and SciPy each load their own OpenBLAS, of different versions
    assert timing._package("/v/lib/python3.11/site-packages/numpy.libs/libscipy_openblas64_.so"
                           ) == "numpy"
    assert timing._package("/v/lib/python3.11/site-packages/scipy.libs/libscipy_openblas.so"
                           ) == "scipy"
    assert timing._package("/usr/lib/libopenblas.so") is None
    entry = {"internal_api": "openblas", "version": "0.3.30", "architecture": "Haswell"}
    assert timing.blas_label(entry) == "openblas 0.3.30 (Haswell)"
    assert timing.blas_label({**entry, "package": "scipy"}) == "openblas 0.3.30 (Haswell) of scipy"


def test_blas_limiter_restores_each_blas_to_its_own_threads():
    import scipy.linalg.cython_blas  # noqa: F401 (loads SciPy's BLAS beside NumPy's)
    from threadpoolctl import ThreadpoolController
    libs = ThreadpoolController().select(user_api="blas").lib_controllers
    if len(libs) < 2:
        pytest.skip("one BLAS here: nothing to tell apart")
    before = [lib.get_num_threads() for lib in libs]
    try:
        libs[0].set_num_threads(1)
        libs[1].set_num_threads(2)
        if libs[1].get_num_threads() != 2:
            pytest.skip("this BLAS will not run on two threads here")
        limit = timing.blas_limiter()
        limit(1)
        assert [lib.get_num_threads() for lib in libs[:2]] == [1, 1]
        limit(None)              # each back to its own, not all to the most any had
        assert [lib.get_num_threads() for lib in libs[:2]] == [1, 2]
    finally:
        for lib, threads in zip(libs, before):
            lib.set_num_threads(threads)


@pytest.mark.parametrize("first_s, warm, calls", [
    (0.0, True, {"fwd": 3, "both": 4}),       # fast: a warm-up, then three of each
    (0.0, False, {"fwd": 3, "both": 4}),
    (0.6, True, {"fwd": 1, "both": 1}),       # slow and warm: the first call is the timing
    (0.6, False, {"fwd": 1, "both": 2}),      # slow, cold: the first call may compile
])
def test_point_times_a_slow_call_once_and_a_warm_one_from_its_first(monkeypatch, first_s,
                                                                     warm, calls):
    monkeypatch.setattr(timing, "SLOW", 0.5)  # a no-op call stays far below it, even busy
    counts = {"fwd": 0, "both": 0}

    def forward():
        counts["fwd"] += 1

    def both():
        counts["both"] += 1
        time.sleep(first_s if counts["both"] == 1 else 0.0)

    fwd_median, fwd_best, both_median, both_best = timing.point(forward, both, 3, warm)
    assert counts == calls
    assert fwd_best <= fwd_median < 0.5 and both_best <= both_median
    # the slow first call is the forward + backward timing where, and only where, it is warm
    assert (both_median >= first_s > 0) == (first_s > 0 and warm)
    assert both_median < 0.5 or (first_s > 0 and warm)


def test_over_budget_gives_a_call_past_the_tokens_time_in_proportion():
    from linattn.lab.bench.timing import over_budget
    assert over_budget(3.0, 2.0, batch=2, n=8, tokens=16)          # T tokens' work: 2 s
    assert not over_budget(3.0, 2.0, batch=1, n=32, tokens=16)     # twice the work: 4 s
    assert over_budget(5.0, 2.0, batch=1, n=32, tokens=16)
    assert not over_budget(7.9, 2.0, batch=1, n=64, tokens=16)     # four times: 8 s
    assert not over_budget(1.9, 2.0, batch=2, n=8, tokens=16)      # up to N = T: per call
    assert over_budget(3.0, 2.0, batch=1, n=64)                    # no tokens: per call
    assert not over_budget(2.0, 2.0, batch=1, n=64)


def test_over_budget_stops_at_the_same_n_for_four_times_the_tokens_and_budget():
    from linattn.lab.bench.timing import over_budget
    per_token = [1e-4, 2e-4, 3e-4]                     # seconds a token, at N = 2^9 .. 2^16
    for s in per_token:
        for n in (2**j for j in range(9, 17)):
            small, big = max(1, 2**14 // n), max(1, 2**16 // n)
            assert (over_budget(s * small * n, 3.75, small, n, 2**14)
                    == over_budget(s * big * n, 15.0, big, n, 2**16)), (s, n)


def test_scaling_stops_past_the_tokens_at_the_proportional_budget(monkeypatch):
    from types import SimpleNamespace

    from tqdm import tqdm

    from linattn.lab.bench import cases
    seen = []

    def measure(name, q, k, v, dout, repeats, pause, memory=True, warm=False):
        n = q.shape[-2]
        seen.append((name, n))
        slow = {"causal numba": 3.0, "lsh-1 numba": 5.0}[name] if n == 32 else 0.0
        return {"case": name, "n": n, "forward_backward_s": slow}

    monkeypatch.setattr(cases, "measure", measure)
    cfg = SimpleNamespace(ns=[8, 16, 32, 64], batch=1, tokens=16, heads=1, dim=2, value_dim=2,
                          dtype="float32", cases=["causal numba", "lsh-1 numba"], repeats=3,
                          pause=0.0, budget=2.0)
    cases.scaling(cfg, tqdm(disable=True))
    # at N = 32 (batch 1, twice 16 tokens' work) the budget is 4 s: 3 s goes on, 5 s stops
    assert ("causal numba", 64) in seen and ("lsh-1 numba", 32) in seen
    assert ("lsh-1 numba", 64) not in seen


def test_scaling_calls_a_case_warm_from_its_second_size_on(monkeypatch):
    from types import SimpleNamespace

    from tqdm import tqdm

    from linattn.lab.bench import cases
    seen = []

    def measure(name, q, k, v, dout, repeats, pause, memory=True, warm=False):
        seen.append((name, q.shape[-2], q.shape[0], warm))
        return {"case": name, "n": q.shape[-2], "forward_backward_s": 3.0 if
                (name, q.shape[-2]) == ("lsh-1 numba", 16) else 0.0}

    monkeypatch.setattr(cases, "measure", measure)
    cfg = SimpleNamespace(ns=[8, 16, 32], batch=1, tokens=32, heads=1, dim=2, value_dim=2,
                          dtype="float32", cases=["causal numba", "lsh-1 numba"], repeats=3,
                          pause=0.0, budget=2.0)
    cases.scaling(cfg, tqdm(disable=True))
    assert seen == [("causal numba", 8, 4, False), ("lsh-1 numba", 8, 4, False),
                    ("causal numba", 16, 2, True), ("lsh-1 numba", 16, 2, True),
                    ("causal numba", 32, 1, True)]      # lsh-1 stopped: over the budget
