"""The performance page is built from the committed measurements alone: it names the machine
and the date, and has a table for each measurement the run made."""
import pathlib

from linattn.lab import performance_page
from linattn.lab.figures import read_csv

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIGURES = ROOT / "figures"


def test_page_from_committed_figures(tmp_path):
    page = performance_page.write_page(FIGURES, tmp_path / "performance.md").read_text()
    _, meta = read_csv(FIGURES / "time_vs_n.csv")
    cpu = meta["caption"].split(" on ", 1)[1].split(",")[0]          # the CPU the run named
    assert cpu in page
    assert meta["date"] in page
    for title in ("Head to head", "Time against N", "Peak memory", "One generated token",
                  "Generating images", "Copy task", "Speech, synthetic task",
                  "Associative retrieval", "Thread settings", 'method "auto"'):
        assert f"## {title}" in page or title in page, title
    assert "| curve | N = 512 |" in page                              # the time and memory tables
    assert "| causal linear (Numba) |" in page
    assert "BLAS:" in page and "Numba" in page
    assert "| delta numba chunked | 8 | 64 | 4096 |" in page          # the auto rules' timings
    assert "| pairs P | softmax | linear | decay | delta |" in page    # the retrieval table


def test_committed_page_is_current(tmp_path):
    """docs/performance.md is what the committed figures give: regenerate it with
    ``python -m linattn.lab.performance_page`` after ``make figures``."""
    page = performance_page.write_page(FIGURES, tmp_path / "performance.md").read_text()
    assert (ROOT / "docs" / "performance.md").read_text() == page


def test_missing_files_are_said(tmp_path):
    page = performance_page.write_page(tmp_path, tmp_path / "out.md").read_text()
    assert "Not in this run" in page
    assert "## Thread settings" in page


def test_page_path():
    assert performance_page.page_path("figures") == pathlib.Path("docs/performance.md")
    assert performance_page.page_path("/tmp/x") == pathlib.Path("/tmp/x/performance.md")


def _train_step_json(path, mode, ratio, capability):
    import json
    path.parent.mkdir(parents=True, exist_ok=True)
    isa_ = {"mode": mode, "numba_cpu": "haswell" if mode == "avx2" else "znver4",
            "numba_avx512": mode != "avx2", "openblas_coretype": "Haswell"}
    path.write_text(json.dumps({
        "machine": {"date": f"date-{mode}", "instruction_set": isa_}, "threads": "2 threads",
        "peer": "pft", "peer_cpu_capability": capability, "seq_len": 127, "path": "lean",
        "rounds": 3, "repeats": 3,
        "rows": [{"batch": 16, "ours_s": 1.0, "pft_s": ratio, "pft_over_ours": ratio}]}))


def test_training_step_native_and_avx2_side_by_side(tmp_path):
    _train_step_json(tmp_path / "data" / "train_step.json", "native", 1.5, "AVX512")
    _train_step_json(tmp_path / "data" / "avx2" / "train_step.json", "avx2", 2.5, "AVX2")
    text = performance_page._training_step(tmp_path)
    assert "| quantity | native | AVX2 mode |" in text
    assert "| pft step / linattn step, batch 16 | 1.5 | 2.5 |" in text
    assert "| pft CPU capability (torch) | AVX512 | AVX2 |" in text
    assert "AVX2 mode (numba haswell" in text and "native (numba znver4 with AVX-512)" in text
    assert "date-native" in text and "date-avx2" in text and "Not in this run" not in text


def test_training_step_says_which_file_is_missing(tmp_path):
    assert "Not in this run" in performance_page._training_step(tmp_path)
    _train_step_json(tmp_path / "data" / "avx2" / "train_step.json", "avx2", 2.5, "AVX2")
    text = performance_page._training_step(tmp_path)
    assert "Not in this run: `data/train_step.json` is missing." in text
    assert "| pft step / linattn step, batch 16 | - | 2.5 |" in text


def _generation_csv(path, rnn, pft, meta, floor=1.0):
    from linattn.lab.figures import GENERATION_COLUMNS, write_csv
    from linattn.lab.speed import FLOOR_NAME, NAMES, PEER_NAME
    rows = [{"name": name, "library": "x", "batch": b, "seconds": s, "images_per_s": b / s,
             "seconds_per_image": s / b, "measured": True, "vs_rnn": s / rnn}
            for b in (1, 16) for name, s in ((NAMES["recurrent"], rnn), (PEER_NAME, pft),
                                             (FLOOR_NAME, floor))]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_csv(path, rows, GENERATION_COLUMNS, {"figure": "generation_speed", "caption": "c",
                                               **meta})


def test_generation_ratios_native_and_avx2_side_by_side(tmp_path):
    _generation_csv(tmp_path / "generation_speed.csv", 2.0, 3.0,
                    {"instruction_set": "native (numba znver4 with AVX-512)",
                     "peer_cpu_capability": "AVX512"})
    page = performance_page._generation(tmp_path)
    assert "Not in this run: `data/avx2/generation_speed.csv` is missing." in page
    assert "| pft s / linattn s, batch 16 | 1.5 | - |" in page
    _generation_csv(tmp_path / "data" / "avx2" / "generation_speed.csv", 2.0, 5.0,
                    {"instruction_set": "AVX2 mode (numba haswell, OpenBLAS Haswell)",
                     "peer_cpu_capability": "AVX2", "peers": "pft 0.4"})
    page = performance_page._generation(tmp_path)
    assert "Not in this run" not in page
    assert "| pft s / linattn s, batch 1 | 1.5 | 2.5 |" in page
    assert "| pft s / linattn's products alone, batch 16 | 3 | 5 |" in page
    assert "| pft CPU capability (torch) | AVX512 | AVX2 |" in page
    assert ("| linattn instruction set | native (numba znver4 with AVX-512) | AVX2 mode "
            "(numba haswell, OpenBLAS Haswell) |") in page


def _bench_json(figures_dir, flags):
    """A data/bench.json that records only what ``_no_avx2_mode`` reads: a native run on a
    CPU with ``flags``."""
    import json
    path = figures_dir / "data" / "bench.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": {"instruction_set": {
        "mode": "native", "cpu_flags": list(flags), "numba_cpu": "znver3",
        "numba_avx512": "avx512f" in flags}}}))


def test_a_cpu_without_avx512_shows_its_native_run_as_the_avx2_run(tmp_path):
    """No AVX2-mode files from a CPU with AVX2 and no AVX-512: each section says its native
    run is the AVX2 run, and its tables have the native column only."""
    _bench_json(tmp_path, ("avx2", "fma", "avx"))
    _train_step_json(tmp_path / "data" / "train_step.json", "native", 1.5, "AVX2")
    _generation_csv(tmp_path / "generation_speed.csv", 2.0, 3.0,
                    {"instruction_set": "native (numba znver3 without AVX-512)",
                     "peer_cpu_capability": "AVX2"})
    said = "its native run is the AVX2 run, so `make figures` did not repeat it in AVX2 mode."
    modes = performance_page._modes(None, None, performance_page._no_avx2_mode(tmp_path))
    assert said in modes and "without AVX-512" in modes
    for text in (performance_page._training_step(tmp_path),
                 performance_page._generation(tmp_path)):
        assert said in text and "Not in this run" not in text and "AVX2 mode |" not in text
        assert "| quantity | native |\n" in text
    assert "| pft step / linattn step, batch 16 | 1.5 |\n" in (
        performance_page._training_step(tmp_path))
    assert "| pft s / linattn s, batch 16 | 1.5 |\n" in performance_page._generation(tmp_path)
    _bench_json(tmp_path, ())                                   # no AVX2 at all (ARM)
    assert "has no AVX2" in performance_page._training_step(tmp_path)
    _bench_json(tmp_path, ("avx512f", "avx2"))                  # there, a missing file
    assert "Not in this run: `data/avx2/train_step.json` is missing." in (
        performance_page._training_step(tmp_path))
    assert performance_page._no_avx2_mode(tmp_path) is None


def test_fastest_form_is_read_from_the_rows():
    from linattn.lab.page_rules import _fastest
    rows = [{"case": "delta numba chunked", "n": "64", "forward_backward_best_s": "0.005"},
            {"case": "delta numpy chunked", "n": "64", "forward_backward_best_s": "0.004"},
            {"case": "delta numba chunked", "n": "4096", "forward_backward_best_s": "0.2"},
            {"case": "delta numpy chunked", "n": "4096", "forward_backward_best_s": "0.4"},
            {"case": "decay numba loops", "n": "64", "forward_backward_best_s": ""}]
    assert _fastest(rows) == ("Fastest forward + backward in that run: at N = 64, delta numpy "
                              "chunked; at N = 4096, delta numba chunked.")
    assert _fastest([]) == ""


def test_kernel_sizes_are_recorded_and_said():
    from linattn.lab.bench.timing import kernel_sizes
    sizes = kernel_sizes()
    assert sizes["d"] == 64 and sizes["chunk_size"] in (16, 32)
    said = performance_page._sizes({"kernel_sizes": sizes})
    assert f"{sizes['softmax_tiles'][0]} queries by {sizes['softmax_tiles'][1]} keys" in said
    held = {**sizes, "blas_kernel": "haswell", "softmax_tiles": [256, 256], "blas_held": True,
            "chunk_size": 32}
    assert performance_page._sizes({"kernel_sizes": held}) == (
        "with OpenBLAS's haswell kernel, softmax tiles of 256 queries by 256 keys, the BLAS "
        "held to one thread, causal linear blocks of 32 positions (D = M = 64)")
    assert performance_page._sizes({}) == "not recorded"


def test_where_the_loops_beat_the_blocks_is_read_from_the_rows():
    from linattn.lab.page_rules import _loops_faster

    def row(case, heads, forward, both):
        return {"case": case, "heads": heads, "forward_best_s": forward,
                "forward_backward_best_s": both}
    rows = [row("causal numba loops", 1, "2", "9"), row("causal numba chunked", 1, "3", "5"),
            row("non-causal numba loops", 8, "4", "6"), row("non-causal numba", 8, "1", "2")]
    assert _loops_faster(rows) == ("In this run the loops were faster in: causal forward at "
                                   "1 head.")
    rows[0]["forward_best_s"] = "4"
    assert _loops_faster(rows) == "In this run the blocks were faster in every comparison."
    assert _loops_faster([]) == ""


def test_the_openblas_variables_of_the_run_are_said():
    assert performance_page._settings({}) == "none set"
    assert performance_page._settings(None) == "not recorded"               # an older file
    assert performance_page._settings({"OPENBLAS_NUM_THREADS": "1", "OPENBLAS_CORETYPE":
                                       "Haswell"}) == ("`OPENBLAS_CORETYPE=Haswell`, "
                                                       "`OPENBLAS_NUM_THREADS=1`")
