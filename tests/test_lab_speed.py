"""The generation-speed table: its rows and columns at a tiny shape, the extrapolation's
arithmetic on synthetic per-token costs, the peer's subprocess protocol, and the command
line. Timing is never asserted; only the table's structure and arithmetic."""
import json
import os
import subprocess
import sys

import pytest

from linattn.lab import speed

TINY = dict(vocab_size=8, d_model=16, n_layers=2, n_heads=2, d_mlp=32)
# the peer's protocol (peer_generate.py): a line about itself, then a line per request
FAKE_PEER = """import json, sys
config = json.loads(sys.argv[1])
print(json.dumps({"torch": "0", "fast_transformers": "0", "threads": config["threads"],
                  "blas": "none"}), flush=True)
for line in sys.stdin:
    batch = json.loads(line)["batch"]
    print(json.dumps({"batch": batch, "seconds": 2.0 * batch}), flush=True)
"""


def _table(**kw):
    return speed.speed_table(**{"batches": (1, 2), "rounds": 1, "shape": TINY, "n": 6, **kw})


@pytest.mark.parametrize("budget_s, recompute_measured", [(0.0, False), (1e9, True)])
def test_speed_table_has_a_row_per_form_and_batch(budget_s, recompute_measured):
    rows, meta = _table(budget_s=budget_s)
    want = []
    for _, method in speed.FORMS:
        for b in (1, 2):
            want.append((speed.NAMES[method], b))
            if method == "recurrent":                    # its floor follows it
                want.append((speed.FLOOR_NAME, b))
    assert [(r["name"], r["batch"]) for r in rows] == want
    for r in rows:
        assert r["library"] == "linattn" and r["dtype"] == "float32" and r["n"] == 6
        assert r["seconds"] > 0
        assert r["images_per_s"] == pytest.approx(r["batch"] / r["seconds"])
        assert r["seconds_per_image"] == pytest.approx(r["seconds"] / r["batch"])
        assert r["measured"] == (r["name"] != speed.NAMES["recompute"] or recompute_measured)
        rnn = next(x for x in rows if x["name"] == speed.NAMES["recurrent"]
                   and x["batch"] == r["batch"])
        assert r["vs_rnn"] == pytest.approx(r["seconds"] / rnn["seconds"])
    assert "threads" in meta["threads"] and meta["peers"].startswith("none")
    assert "2 layers" in meta["model"] and "N = 6" in meta["model"]


def test_format_table_names_every_row_and_how_it_was_timed():
    rows, meta = _table(budget_s=0.0)
    text = speed.format_table(rows, meta)
    header = text.splitlines()[0]
    for column in ("form", "library", "batch", "s / batch", "s / image", "images/s",
                   "s / RNN s", "how"):
        assert column in header
    body = text.splitlines()[2:2 + len(rows)]
    assert [line.split()[-1] for line in body] == ["measured"] * 6 + ["estimated"] * 2
    assert "machine:" in text and "threads:" in text and "peers: none" in text
    assert "target" not in text.lower() and " met" not in text.lower()


def test_products_floor_runs_the_loops_products(monkeypatch):
    """The floor row times ``token_loop.token_products``: n calls per image, with the loop's
    multiply (``token_kernels.product``, row by row, at batch 1; NumPy's at batch 2)."""
    from linattn.model.fast import token_kernels as kernels
    from linattn.model.fast import token_loop
    calls, products = [], []
    real, real_product = token_loop.token_products, kernels.product
    monkeypatch.setattr(token_loop, "token_products", lambda w, b: calls.append(
        b.x.shape[1]) or real(w, b))
    monkeypatch.setattr(kernels, "product", lambda *a: products.append(1) or real_product(*a))
    cfg = speed.ModelConfig(max_len=6, attention="linear", **TINY)
    params = speed.init_params(cfg, seed=0)
    for batch in (1, 2):
        calls.clear(), products.clear()
        assert speed.products_seconds(params, cfg, batch, 6, rounds=2) > 0
        assert calls == [batch] * (1 + 2 * 6)           # a warm-up, then 2 rounds of 6
        assert len(products) == (len(calls) * (4 * TINY["n_layers"] + 1) if batch == 1
                                 else 0)


@pytest.mark.parametrize("growth", [0, 1, 2])
def test_estimate_extrapolates_past_the_probes_by_the_forms_growth(growth):
    asked = []

    def cost(t):
        asked.append(t)
        return 1e-3 * (1.0 + float(t) ** growth)
    n = 1000                                       # probes reach t = 100; the rest is extrapolated
    exact = sum(1e-3 * (1.0 + float(t) ** growth) for t in range(n))
    got = speed.estimate_seconds(cost, n, growth, probe_limit=100)
    assert got == pytest.approx(exact, rel=0.02)
    assert max(asked) == 100 and len(asked) == 6


def test_estimate_is_exact_for_a_linear_cost_within_the_probes():
    # interpolation between probes is exact for a cost linear in t, and nothing is extrapolated
    got = speed.estimate_seconds(lambda t: 2.0 + 3.0 * t, 784, 2)
    assert got == pytest.approx(sum(2.0 + 3.0 * t for t in range(784)), rel=1e-12)
    assert speed.estimate_seconds(lambda t: 5.0, 1, 2) == 5.0       # one token: one probe


def test_peer_rows_join_the_table_with_their_ratio(monkeypatch, tmp_path):
    script = tmp_path / "fake_peer.py"
    script.write_text(FAKE_PEER)
    monkeypatch.setattr(speed, "PEER_SCRIPT", str(script))
    rows, meta = _table(budget_s=0.0, peer_python=sys.executable)
    peers = [r for r in rows if r["library"] != "linattn"]
    assert [(r["name"], r["batch"], r["seconds"]) for r in peers] == [
        (speed.PEER_NAME, 1, 2.0), (speed.PEER_NAME, 2, 4.0)]
    rnn = {r["batch"]: r["seconds"] for r in rows if r["name"] == speed.NAMES["recurrent"]}
    assert all(r["vs_rnn"] == pytest.approx(r["seconds"] / rnn[r["batch"]]) for r in peers)
    assert "2 threads" in meta["peers"] and "BLAS none" in meta["peers"]
    assert meta["peer_cpu_capability"] is None             # the fake peer does not say


@pytest.mark.parametrize("interpreter, why", [(sys.executable, "no fast_transformers"),
                                               ("/no/such/python", "No such file")])
def test_a_failing_peer_leaves_its_rows_out_and_says_why(monkeypatch, tmp_path, interpreter,
                                                         why):
    script = tmp_path / "broken_peer.py"
    script.write_text("raise SystemExit('no fast_transformers here')\n")
    monkeypatch.setattr(speed, "PEER_SCRIPT", str(script))
    rows, meta = _table(batches=(1,), budget_s=0.0, peer_python=interpreter)
    assert all(r["library"] == "linattn" for r in rows)
    assert meta["peers"].startswith("failed") and why in meta["peers"]


def test_a_peer_that_stops_answering_leaves_its_rows_out(monkeypatch, tmp_path):
    script = tmp_path / "quitting_peer.py"       # says what it is, then exits at a request
    script.write_text(FAKE_PEER.split("for line")[0] + "sys.stdin.readline()\n"
                      "raise SystemExit('out of memory')\n")
    monkeypatch.setattr(speed, "PEER_SCRIPT", str(script))
    rows, meta = _table(batches=(1,), budget_s=0.0, peer_python=sys.executable)
    assert all(r["library"] == "linattn" for r in rows)
    assert meta["peers"].startswith("failed") and "out of memory" in meta["peers"]


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("PEER_PYTHON"),
                    reason="PEER_PYTHON (an interpreter with torch and fast_transformers) "
                           "is not set")
def test_peer_script_generates_with_pft_and_answers_json_lines():
    config = {"layers": 2, "heads": 2, "d_model": 16, "d_mlp": 32, "vocab": 8, "n": 5,
              "threads": 2}
    requests = "".join(json.dumps({"batch": b}) + "\n" for b in (1, 3, 1))
    run = subprocess.run([os.environ["PEER_PYTHON"], speed.PEER_SCRIPT, json.dumps(config)],
                         input=requests, capture_output=True, text=True, check=True)
    about, *answers = map(json.loads, run.stdout.splitlines())
    assert about["threads"] == 2 and about["fast_transformers"]
    assert about["cpu_capability"]                          # the vector kernels torch picked
    assert [a["batch"] for a in answers] == [1, 3, 1]
    assert all(a["seconds"] > 0 for a in answers)


def _fixture_rows():
    return [{"name": name, "library": "linattn", "batch": b, "seconds": s,
             "seconds_per_image": s / b, "images_per_s": b / s, "measured": m,
             "vs_rnn": s / 1.0, "n": 6, "dtype": "float32"}
            for name, s, m in (("linear, RNN", 1.0, True), ("softmax, recomputing", 9.0, False))
            for b in (1, 4)]


def test_cli_parses_and_prints_the_table_and_csv(monkeypatch, tmp_path, capsys):
    from linattn.lab.figures import read_csv
    from linattn.lab.speed import main as speed_main
    seen = {}

    def fake_table(batches, rounds, peer_python, budget_s, forms):
        seen.update(batches=batches, rounds=rounds, peer=peer_python, budget=budget_s,
                    forms=forms)
        return _fixture_rows(), {"machine": "m", "threads": "t", "peers": "p",
                                 "dtype": "float32", "model": "tiny", "rounds": str(rounds)}
    monkeypatch.setattr(speed, "speed_table", fake_table)
    out = tmp_path / "sub" / "speed.csv"
    assert speed_main(["--batch", "1", "4", "--rounds", "2", "--peer-python", sys.executable,
                       "--budget", "5", "--csv", str(out)]) == 0
    assert seen == dict(batches=[1, 4], rounds=2, peer=sys.executable, budget=5.0,
                        forms=speed.FORMS)
    printed = capsys.readouterr().out
    assert "softmax, recomputing" in printed and "estimated" in printed
    back, meta = read_csv(out)
    assert [(r["name"], r["batch"]) for r in back] == [(r["name"], r["batch"])
                                                        for r in _fixture_rows()]
    assert meta["figure"] == "generation_speed" and meta["machine"] == "m"
    assert meta["date"]                                   # the page names the run's date


@pytest.mark.parametrize("argv", [["--batch", "0"], ["--rounds", "0"], ["--batch", "x"]])
def test_cli_rejects_bad_arguments(argv, monkeypatch):
    from linattn.lab.speed import main as speed_main
    monkeypatch.setattr(speed, "speed_table", lambda *a: pytest.fail("should not run"))
    with pytest.raises(SystemExit):
        speed_main(argv)


def test_default_shape_is_the_papers_mnist_model():
    cfg = speed.ModelConfig(max_len=speed.N_MNIST, **speed.MNIST)
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head, cfg.d_mlp) == (8, 8, 256, 32,
                                                                               1024)
    assert cfg.vocab_size == 256 and speed.N_MNIST == 28 * 28 and cfg.dtype == "float32"
    assert speed.THREADS == 2


def test_rnn_forms_alone_with_the_instruction_set(monkeypatch, tmp_path):
    """The AVX2-mode run's table: linattn's RNN (and its floor) and the peer's, no softmax;
    the meta names our instruction set and the peer's vector kernels."""
    script = tmp_path / "fake_peer.py"
    script.write_text(FAKE_PEER.replace('"blas": "none"}', '"blas": "none", '
                                        '"cpu_capability": "AVX2"}'))
    monkeypatch.setattr(speed, "PEER_SCRIPT", str(script))
    rows, meta = _table(forms=speed.RNN_FORMS, peer_python=sys.executable)
    assert [(r["name"], r["batch"]) for r in rows] == [
        (speed.NAMES["recurrent"], 1), (speed.FLOOR_NAME, 1), (speed.NAMES["recurrent"], 2),
        (speed.FLOOR_NAME, 2), (speed.PEER_NAME, 1), (speed.PEER_NAME, 2)]
    assert meta["peer_cpu_capability"] == "AVX2" and "capability AVX2" in meta["peers"]
    assert meta["instruction_set"].startswith(("native (numba", "AVX2 mode (numba"))


def test_cli_rnn_only_passes_the_rnn_forms(monkeypatch):
    from linattn.lab.speed import main as speed_main
    seen = {}

    def fake_table(batches, rounds, peer_python, budget_s, forms):
        seen["forms"] = forms
        return _fixture_rows()[:2], {"machine": "m", "threads": "t", "peers": "p",
                                     "dtype": "float32", "model": "tiny", "rounds": "1"}
    monkeypatch.setattr(speed, "speed_table", fake_table)
    assert speed_main(["--rnn-only", "--batch", "1", "--rounds", "1"]) == 0
    assert seen["forms"] == speed.RNN_FORMS


@pytest.mark.parametrize("budget_s, measured", [(29.0, False), (30.0, True)])
def test_recompute_is_measured_only_when_every_round_fits_the_budget(monkeypatch, budget_s,
                                                                     measured):
    """Estimated at 10 s an image, 3 rounds take 30 s: measured with a budget of 30 s, not
    29 (the estimate alone, 10 s, fits both)."""
    monkeypatch.setattr(speed, "generate", lambda *a, **k: None)
    monkeypatch.setattr(speed, "estimate_seconds", lambda *a, **k: 10.0)
    monkeypatch.setattr(speed, "_timed", lambda f, rounds: 7.0)
    params, cfg = None, type("Cfg", (), {"vocab_size": 8})()
    got = speed.form_seconds(params, cfg, "recompute", 1, 6, 3, budget_s)
    assert got == ((7.0, True) if measured else (10.0, False))
