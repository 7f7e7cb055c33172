"""Figures: each function writes a PNG and a CSV that reads back the numbers it was given."""
import math

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from linattn.lab import figures  # noqa: E402


def _rows(columns, x, xs):
    """Synthetic rows for a schema: two curves, one with a missing value and a repeat."""
    rows = []
    for name, power in (("quadratic", 2.0), ("linear", 1.0)):
        for i, xv in enumerate(xs):
            row = {"name": name, x: xv}
            for j, c in enumerate(c for c in columns if c not in ("name", x)):
                row[c] = (1 + j) * 1e-6 * xv ** power + 1e-9 * i
            rows.append(row)
    rows[0][columns[-1]] = None                        # a missing value is left out
    rows.append({**rows[1], columns[-1]: 2.5 * rows[1][columns[-1]]})  # a repeat: a band
    return rows


CASES = [
    (figures.time_vs_n, figures.TIME_COLUMNS, "n"),
    (figures.memory_vs_n, figures.MEMORY_COLUMNS, "n"),
    (figures.time_per_token, figures.TOKEN_COLUMNS, "position"),
    (figures.feature_map_error, figures.FEATURE_MAP_COLUMNS, "n_features"),
    (figures.copy_task_loss, figures.COPY_COLUMNS, "step"),
]


@pytest.mark.parametrize("draw, columns, x", CASES, ids=[c[0].__name__ for c in CASES])
def test_figure_writes_png_and_csv_that_round_trips(tmp_path, draw, columns, x):
    rows = _rows(columns, x, [1, 2, 4, 8, 16])
    png, table = draw(rows, tmp_path / "sub" / draw.__name__, title="synthetic")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    back, meta = figures.read_csv(table)
    assert meta["figure"] == draw.__name__ and {"date", "machine"} <= set(meta)
    assert len(back) == len(rows)
    for got, want in zip(back, rows):
        assert set(got) == set(columns)
        for key in columns:
            assert got[key] == want.get(key), (key, got, want)


def test_csv_keeps_extra_keys_nan_and_numpy_scalars(tmp_path):
    rows = [{"name": "a", "n": np.int64(3), "seconds_fwd": np.float64(0.1), "dtype": "float32"},
            {"name": "b", "n": 5, "seconds_fwd": math.nan, "dtype": "float64"}]
    table = tmp_path / "t.csv"
    figures.write_csv(table, rows, figures.TIME_COLUMNS, {"figure": "t"})
    back, _ = figures.read_csv(table)
    assert back[0] == {"name": "a", "n": 3, "seconds_fwd": 0.1, "seconds_fwdbwd": None,
                       "dtype": "float32"}
    assert math.isnan(back[1]["seconds_fwd"])


def test_slope_is_fitted_over_the_larger_half():
    xs = np.array([1.0, 2, 4, 8, 16, 32])
    ys = np.where(xs < 8, 1.0, xs ** 2)                # flat overhead, then quadratic
    assert figures.slope(xs, ys) == pytest.approx(2.0)
    assert figures.slope(np.array([4.0]), np.array([1.0])) is None


@pytest.mark.parametrize("rows, match", [
    ([], "no rows"),
    ([{"n": 4, "seconds_fwd": 1.0}], "'name'"),
    ([{"name": "a", "seconds_fwd": 1.0}], "'n'"),
    ([{"name": "a", "n": 0, "seconds_fwd": 1.0}], "positive"),
    ([{"name": "a", "n": 4, "seconds_fwd": None}], "no values"),
])
def test_bad_rows_are_a_clear_error(tmp_path, rows, match):
    with pytest.raises(ValueError, match=match):
        figures.time_vs_n(rows, tmp_path / "t")


def test_copy_task_loss_draws_eval_rows_among_training_rows(tmp_path):
    # the shape measure.copy_task_rows returns: held-out loss only every few steps
    rows = [{"name": name, "step": s, "train_loss": 2.0 / s,
             "eval_loss": 1.5 / s if s % 5 == 0 else None, "eval_acc": 0.5}
            for name in ("linear", "softmax") for s in range(1, 21)]
    png, table = figures.copy_task_loss(rows, tmp_path / "copy")
    back, _ = figures.read_csv(table)
    assert [r["eval_loss"] for r in back[:5]] == [None] * 4 + [0.3]
    assert back[0]["eval_acc"] == 0.5                  # extra keys are kept
    with pytest.raises(ValueError, match="no values"):
        figures.copy_task_loss([{"name": "a", "step": 1, "eval_loss": None}], tmp_path / "x")


@pytest.mark.slow
def test_main_quick_writes_every_figure(tmp_path, capsys):
    assert figures.main(["--quick", "--out", str(tmp_path)]) == 0
    for name in ("time_vs_n", "memory_vs_n", "time_per_token", "feature_map_error",
                 "copy_task_loss", "generation_speed"):
        assert (tmp_path / f"{name}.png").exists() and (tmp_path / f"{name}.csv").exists()
    assert (tmp_path / "data" / "bench.json").exists()
    assert f"[{len(figures.FIGURES)}/{len(figures.FIGURES)}]" in capsys.readouterr().out


def test_a_caption_of_several_lines_stays_in_the_csv_header(tmp_path):
    rows = [{"name": "a", "n": 2, "seconds_fwd": 1.0}, {"name": "a", "n": 4, "seconds_fwd": 2.0}]
    figures.time_vs_n(rows, tmp_path / "t", caption="first line\nsecond line")
    back, meta = figures.read_csv(tmp_path / "t.csv")
    assert meta["caption"] == "first line second line"
    assert [r["n"] for r in back] == [2, 4]


def _generation_rows():
    """Rows of speed_table's schema: two forms of linattn (one estimated) and a peer."""
    rows = []
    for name, library, s1, s16, measured in (
            ("linear, RNN", "linattn", 1.5, 5.0, True),
            ("softmax, recomputing the prefix", "linattn", 120.0, 900.0, False),
            ("pft linear, RNN", "pytorch-fast-transformers", 2.0, 4.5, True)):
        for batch, seconds in ((1, s1), (16, s16)):
            rows.append({"name": name, "library": library, "batch": batch,
                         "seconds": seconds, "seconds_per_image": seconds / batch,
                         "images_per_s": batch / seconds, "measured": measured})
    return rows


def test_generation_speed_draws_from_its_csv(tmp_path):
    # the CSV a run wrote (booleans come back as text) draws again, and round-trips
    fixture = tmp_path / "fixture.csv"
    figures.write_csv(fixture, _generation_rows(), figures.GENERATION_COLUMNS,
                      {"figure": "generation_speed", "caption": "machine X"})
    rows, meta = figures.read_csv(fixture)
    assert rows[2]["measured"] == "False" and meta["caption"] == "machine X"
    png, table = figures.generation_speed(rows, tmp_path / "g", title="t", caption="machine X")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    back, meta = figures.read_csv(table)
    assert meta["figure"] == "g" and meta["caption"] == "machine X"
    assert [(r["name"], r["batch"], r["images_per_s"]) for r in back] == [
        (r["name"], r["batch"], r["images_per_s"]) for r in rows]


def test_generation_csv_names_each_sides_instruction_set(tmp_path):
    # the performance page reads these two lines to name what each side ran with
    meta = {"machine": "m", "threads": "t", "peers": "p", "rounds": "3", "model": "tiny",
            "dtype": "float32", "instruction_set": "native (numba x with AVX-512)",
            "peer_cpu_capability": "AVX512"}
    _, table = figures.generation_figure(_generation_rows(), meta, tmp_path)
    _, back = figures.read_csv(table)
    assert back["instruction_set"] == "native (numba x with AVX-512)"
    assert back["peer_cpu_capability"] == "AVX512"


def test_generation_speed_rejects_rows_without_a_batch(tmp_path):
    with pytest.raises(ValueError, match="no rows"):
        figures.generation_speed([], tmp_path / "g")
    with pytest.raises(ValueError, match="'batch'"):
        figures.generation_speed([{"name": "a", "images_per_s": 1.0}], tmp_path / "g")


@pytest.mark.parametrize("quick", [True, False])
def test_benchmark_step_runs_the_training_step_in_both_modes_unless_quick(
        monkeypatch, tmp_path, quick):
    """Not quick, on a CPU with AVX-512, ``_benchmark`` adds the AVX2 head to head and one
    training step per mode (native into data/, AVX2 into data/avx2/); quick runs none of
    these subprocesses."""
    from linattn.lab import figures, isa, measure
    monkeypatch.setattr(isa, "avx2_mode_adds", lambda: True)
    calls = []
    meta = {"machine": "m", "dtype": "float32", "budget": 1.0, "tokens": 64, "peers": "none"}
    monkeypatch.setattr(measure, "benchmark_rows", lambda *a: ([], [], meta))
    monkeypatch.setattr(measure, "avx2_head_to_head", lambda *a: calls.append(("bench",)))
    monkeypatch.setattr(measure, "train_step_head_to_head",
                        lambda path, mode, peer: calls.append((path, mode, peer)))
    for draw in ("time_vs_n", "memory_vs_n", "time_per_token"):
        monkeypatch.setattr(figures, draw, lambda *a, **k: ())
    figures._benchmark(tmp_path, quick, "c", "PEER")
    want = [] if quick else [("bench",),
                             (tmp_path / "data" / "train_step.json", "native", "PEER"),
                             (tmp_path / "data" / "avx2" / "train_step.json", "avx2", "PEER")]
    assert calls == want


def test_a_cpu_without_avx512_is_measured_once_and_loses_older_avx2_files(monkeypatch,
                                                                          tmp_path):
    """Where the AVX2 mode would repeat the native run (``isa.avx2_mode_adds`` False), the
    benchmark and generation steps run the native measurements only and remove the AVX2
    files an earlier run left (another machine's, perhaps), then the empty folder."""
    from linattn.lab import figures, isa, measure, speed
    monkeypatch.setattr(isa, "avx2_mode_adds", lambda: False)
    calls = []
    meta = {"machine": "m", "dtype": "float32", "budget": 1.0, "tokens": 64, "peers": "none"}
    monkeypatch.setattr(measure, "benchmark_rows", lambda *a: ([], [], meta))
    monkeypatch.setattr(measure, "avx2_head_to_head", lambda *a: calls.append(("bench",)))
    monkeypatch.setattr(measure, "avx2_generation", lambda *a: calls.append(("generation",)))
    monkeypatch.setattr(measure, "train_step_head_to_head",
                        lambda path, mode, peer: calls.append((path, mode, peer)))
    monkeypatch.setattr(speed, "speed_table", lambda **kw: ([], {}))
    monkeypatch.setattr(figures, "generation_figure", lambda rows, meta, out: ())
    for draw in ("time_vs_n", "memory_vs_n", "time_per_token"):
        monkeypatch.setattr(figures, draw, lambda *a, **k: ())
    old = tmp_path / "data" / "avx2"
    old.mkdir(parents=True)
    for name in ("bench.json", "bench.txt", "bench_scaling.csv", "train_step.json",
                 "generation_speed.csv"):
        (old / name).write_text("an earlier run's")
    figures._benchmark(tmp_path, False, "c", "PEER")
    assert calls == [(tmp_path / "data" / "train_step.json", "native", "PEER")]
    assert sorted(p.name for p in old.iterdir()) == ["generation_speed.csv"]
    figures._generation(tmp_path, False, "c", "PEER")
    assert len(calls) == 1 and not old.exists()


def test_avx2_run_times_every_head_to_head_pair_as_the_native_run_does(monkeypatch, tmp_path):
    """The AVX2 run's arguments parse, it runs in the AVX2 mode's environment, and it keeps
    our side of every pair of the head to head (so each head-to-head ratio of the native
    summary has its AVX2 twin) and the headline case as a scaling point, with as many calls a
    timing as the native run."""
    import subprocess
    import sys

    from linattn.lab import bench, isa, measure
    seen = {}
    monkeypatch.setattr(subprocess, "run", lambda args, **kw: seen.update(args=args, **kw))
    measure.avx2_head_to_head(tmp_path, sys.executable)
    assert seen["args"][1:3] == ["-m", "linattn.lab.bench"]
    assert seen["env"] == isa.environment("avx2")
    cfg = bench.parse(seen["args"][3:])
    assert cfg.isa == "avx2" and cfg.ns == [4096] and cfg.widths == []
    assert cfg.repeats == measure.BENCH_REPEATS and cfg.rounds == measure.HEAD_TO_HEAD_ROUNDS
    timed = set(cfg.cases) | set(bench.cases.ALWAYS_HEAD_TO_HEAD)
    assert {ours for ours, _ in bench.cases.PAIRS} <= timed
    assert "causal numba" in cfg.cases

    class Stop(Exception):
        pass

    def main(args):
        seen["native"] = bench.parse(args)
        raise Stop
    monkeypatch.setattr(bench, "main", main)
    with pytest.raises(Stop):
        measure.benchmark_rows(tmp_path)
    assert seen["native"].repeats == cfg.repeats


@pytest.mark.parametrize("quick", [True, False])
def test_generation_step_runs_the_avx2_rnns_unless_quick(monkeypatch, tmp_path, quick):
    from linattn.lab import figures, isa, measure, speed
    monkeypatch.setattr(isa, "avx2_mode_adds", lambda: True)
    calls = []
    monkeypatch.setattr(speed, "speed_table", lambda **kw: ([], {}))
    monkeypatch.setattr(measure, "avx2_generation", lambda *a: calls.append(a))
    monkeypatch.setattr(figures, "generation_figure", lambda rows, meta, out: ())
    figures._generation(tmp_path, quick, "c", "PEER")
    assert calls == ([] if quick else
                     [(tmp_path / "data" / "avx2" / "generation_speed.csv", "PEER")])


def test_only_runs_the_steps_of_the_named_figures(monkeypatch, tmp_path, capsys):
    """--only: the steps whose line names one of the figures, in order; the others not at
    all; an unknown figure is a usage error."""
    from linattn.lab import figures
    ran = []
    monkeypatch.setattr(figures, "FIGURES", [
        (name, lambda out, quick, caption, peer, name=name: ran.append(name) or ())
        for name, _ in figures.FIGURES])
    monkeypatch.setattr("linattn.lab.performance_page.write_page", lambda *a: "page")
    assert figures.main(["--quick", "--out", str(tmp_path), "--only", "generation_speed",
                         "memory_vs_n"]) == 0
    assert ran == ["time_vs_n, memory_vs_n, time_per_token", "generation_speed"]
    assert "[2/2] generation_speed" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        figures.main(["--only", "no_such_figure"])


def test_growth_drops_the_constant_a_log_log_slope_keeps():
    from linattn.lab.figures import growth, slope
    n = np.array([1024.0, 2048.0, 4096.0])
    scratch_and_output = 3e5 + 256 * n                    # a constant, then linear
    assert growth(n, scratch_and_output) == pytest.approx(1.0, abs=1e-12)
    assert slope(n, scratch_and_output) < 0.8             # the log-log fit bends below 1
    assert growth(n, 7 + 5 * n ** 2) == pytest.approx(2.0, abs=1e-6)
    rounded = np.array([round(2 ** (p / 2)) for p in range(20, 25)], dtype=float)
    assert growth(rounded, 256 * rounded) == pytest.approx(1.0, abs=5e-3)
    with pytest.raises(ValueError, match="evenly"):
        growth([1, 2, 5], [1, 2, 3])
    with pytest.raises(ValueError, match="three"):
        growth([1, 2], [1, 2])


def test_main_makes_its_output_folder_before_the_first_step(monkeypatch, tmp_path):
    """A new --out folder exists when the first step starts (a step writes its CSV only at
    its end, after minutes or hours of training)."""
    from linattn.lab import figures
    out = tmp_path / "new" / "folder"
    seen = []
    monkeypatch.setattr(figures, "FIGURES", [
        ("feature_map_error", lambda out_, quick, caption, peer: seen.append(out_.is_dir())
         or ())])
    monkeypatch.setattr("linattn.lab.performance_page.write_page", lambda *a: "page")
    assert figures.main(["--quick", "--out", str(out)]) == 0
    assert seen == [True]


def test_round_slopes_fit_each_round_on_its_own():
    """The last round speeds up 2x between N = 1024 and 2048: the best time per point over
    all rounds takes that bend (a slope of 0), the median of the rounds' slopes does not."""
    ns = [256, 512, 1024, 2048]
    rows = []
    for r in range(5):
        for n in ns:
            factor = 0.5 if r == 4 and n == 2048 else 1.0
            rows.append({"name": "linear", "n": n, "round": r, "seconds_fwd": factor * 1e-6 * n})
    median, per_round = figures.round_slopes(rows, "linear", "seconds_fwd")
    assert per_round[4] == pytest.approx(0.0) and median == pytest.approx(1.0)
    best = [{"name": "linear", "n": n, "seconds_fwd": min(row["seconds_fwd"] for row in rows
                                                         if row["n"] == n)} for n in ns]
    assert figures.fitted_slope(best, "linear", "seconds_fwd") == pytest.approx(0.0)
    with pytest.raises(ValueError, match="every round"):
        figures.round_slopes(rows[:1], "linear", "seconds_fwd")
