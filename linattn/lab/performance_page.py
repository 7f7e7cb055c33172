"""The performance page, ``docs/performance.md``, written from the lab's files, never by hand.

``write_page(figures_dir, out)`` reads what ``python -m linattn.lab.figures`` wrote (each
figure's CSV, whose ``# key: value`` header names the machine and the date, and the
benchmark's ``data/bench.json`` and ``data/bench_*.csv``) and writes one Markdown page: the
machine, its BLAS and threads, the date of the run, then a table per measurement. Every
number on the page comes from those files, so the page is as old as the run it names;
``figures.main`` rewrites it after each run, and

    python -m linattn.lab.performance_page [--figures figures] [--out docs/performance.md]

rewrites it from the committed files alone (no measuring). A file that is missing leaves
its section saying so. Two sections hold fixed prose: what each thread setting of
``linattn.threads`` does, and the rule by which the Numba backend's method "auto" picks a
form; their numbers, too, come from the files.
"""
import argparse
import pathlib


from . import isa
from .bench.timing import OPENBLAS_VARIABLES, SLOW, blas_label
from .figures import fitted_slope
from .measure import crossover_n
from .page_experiments import _copy_task, _images, _retrieval, _speech
from .page_format import _csv, _json, _missing, _pivot, _sig, _source, _table
from .page_rules import _auto, _threads


def page_path(figures_dir):
    """Where the page of ``figures_dir`` goes: ``docs/performance.md`` beside a folder named
    ``figures`` (the repository's), else ``performance.md`` inside it (a scratch run)."""
    figures_dir = pathlib.Path(figures_dir)
    if figures_dir.name == "figures":
        return figures_dir.parent / "docs" / "performance.md"
    return figures_dir / "performance.md"


def write_page(figures_dir="figures", out="docs/performance.md"):
    """Build the page from the files in ``figures_dir`` and write it to ``out``.

    Returns
    -------
    pathlib.Path
        The page written.
    """
    figures_dir, out = pathlib.Path(figures_dir), pathlib.Path(out)
    bench = _json(figures_dir / "data" / "bench.json")
    sections = [_header(figures_dir, bench), _summary(bench),
                _modes(bench, _json(figures_dir / "data" / "avx2" / "bench.json"),
                       _no_avx2_mode(figures_dir)),
                _time(figures_dir),
                _memory(figures_dir), _tokens(figures_dir), _generation(figures_dir),
                _training_step(figures_dir), _copy_task(figures_dir), _images(figures_dir),
                _speech(figures_dir), _retrieval(figures_dir), _threads(bench),
                _auto(figures_dir, bench)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n\n".join(s.strip("\n") for s in sections if s) + "\n")
    return out


# ---- sections

def _header(figures_dir, bench):
    lines = ["# Performance", "",
             "Written by `linattn.lab.performance_page` from the files `make figures` "
             "writes (the CSVs in `figures/`, the benchmark's `figures/data/`); do not edit "
             "it by hand. Each section names the date of its file, and where a file came "
             "from another run than the benchmark's, its machine. Other machines give other "
             "numbers, and other ratios: read each as its run's.", ""]
    if bench is None:
        _, meta = _csv(figures_dir / "time_vs_n.csv")
        lines.append(f"- machine: {meta.get('machine', 'not recorded')}")
        lines.append(f"- date: {meta.get('date', 'not recorded')}")
        return "\n".join(lines)
    m = bench["machine"]
    blas = m.get("blas")
    if isinstance(blas, list):
        blas = "; ".join(f"{blas_label(b)}, {b.get('num_threads')} threads, "
                         f"{b.get('threading_layer')}" for b in blas)
    peers = bench.get("peers") or {}
    lines += [f"- date of the benchmark: {m.get('date')}",
              f"- CPU: {m.get('cpu')}, {m.get('cores_available')} cores available",
              f"- BLAS: {blas}",
              f"- Python {m.get('python')}, NumPy {m.get('numpy')}, Numba {m.get('numba')} on "
              f"{m.get('numba_threads')} threads "
              f"(threading layer {m.get('numba_threading_layer')})",
              f"- float32 matrix-product ceiling: {_sig(bench.get('ceiling_gflops'))} GFLOP/s "
              "(measured once at the start; a row below that gives a fraction of it divides by "
              "the ceiling measured again in its own round)",
              f"- peers: {bench.get('peers_note') or 'none'}"
              + (f"; pytorch-fast-transformers: {'yes' if peers.get('fast_transformers') else 'no'}"
                 if peers else ""),
              f"- OpenBLAS's variables in the benchmark's environment "
              f"({', '.join(f'`{k}`' for k in OPENBLAS_VARIABLES)}): "
              f"{_settings(m.get('openblas_env'))}"]
    cfg = bench.get("config", {})
    if cfg:
        batch = (f"scaling at batch = max(1, {cfg['tokens']} / N)" if cfg.get("tokens")
                 else f"batch {cfg.get('batch')}")
        lines.append(f"- shapes: {cfg.get('heads')} heads, D = {cfg.get('dim')}, "
                     f"M = {cfg.get('value_dim')}, {cfg.get('dtype')}; {batch}; head to head "
                     f"at N = {cfg.get('compare_n')}, batch {cfg.get('batch')}, "
                     f"{cfg.get('rounds')} rounds")
    return "\n".join(lines)


def _settings(env):
    if env is None:
        return "not recorded"
    if not env:
        return "none set"
    return ", ".join(f"`{k}={v}`" for k, v in sorted(env.items()))


def _summary(bench):
    if bench is None or not bench.get("summary"):
        return "## Head to head\n\nNot in this run: `data/bench.json` has no summary."
    rows = [[quantity, _sig(value)] for quantity, value in bench["summary"]]
    return ("## Head to head\n\nThe benchmark's summary: ratios of two timings taken in turn, "
            "and ratios to the machine's own yardsticks, but for two rows: the peak extra "
            "memory, traced bytes over the inputs' bytes, and the per-token row, the cache's "
            "best time over the RNN step's median, from two separate scans of the positions. "
            "A head-to-head ratio (one form or "
            "library over another) is the median over the rounds of its own pair's ratio, so "
            "two rows that share a side need not multiply to a third row exactly; the thread "
            "speedup compares the best times of the two thread counts, and the step-time row "
            "the median steps of the first and last 1024 tokens.\n\n"
            + _table(["quantity", "measured"], rows))


def _no_avx2_mode(figures_dir):
    """Why a run has no AVX2-mode files, from the instruction set its benchmark recorded
    (``data/bench.json``): its CPU's widest vectors are AVX2's, so its native run is the
    AVX2 run, or it has no AVX2 (``isa.avx2_mode_adds``); None where the mode would have
    added a measurement (a missing file is then said as missing). One sentence, without
    its full stop."""
    bench = _json(figures_dir / "data" / "bench.json")
    described = ((bench or {}).get("machine") or {}).get("instruction_set") or {}
    flags = described.get("cpu_flags")
    if described.get("mode") != "native" or flags is None or isa.avx2_mode_adds(flags):
        return None
    if "avx2" in flags:
        return (f"This run's CPU has AVX2 and no AVX-512 ({isa.label(described)}): its "
                f"native run is the AVX2 run, so `make figures` did not repeat it in AVX2 "
                f"mode")
    return (f"This run's CPU has no AVX2 ({isa.label(described)}): the AVX2 mode does not "
            f"apply to it")


def _modes(bench, avx2, no_avx2_mode=None):
    """The summary's ratios in the two instruction-set modes side by side: as this CPU runs
    them, and with every side held to AVX2 (``linattn.lab.isa``); where the run made no
    AVX2-mode files because the mode adds nothing on its CPU, ``no_avx2_mode`` says why."""
    title = "## Head to head as an AVX2-only CPU runs it"
    if avx2 is None and no_avx2_mode:
        return f"{title}\n\n{no_avx2_mode}."
    if bench is None or avx2 is None or not avx2.get("summary"):
        return (f"{title}\n\nNot in this run: `data/avx2/bench.json` is missing "
                "(`make figures` writes it; alone: `python -m linattn bench --isa avx2 --out "
                "figures/data/avx2`).")
    native = dict((q, v) for q, v in bench.get("summary") or [])
    rows = [[q, _sig(native[q]), _sig(v)] for q, v in avx2["summary"] if q in native]
    labels = [isa.label(b["machine"]["instruction_set"]) if b["machine"].get("instruction_set")
              else "not recorded" for b in (bench, avx2)]
    return (f"{title}\n\nThe same ratios measured twice on this machine, in separate runs: "
            f"as it runs them ({labels[0]}) and with Numba, OpenBLAS and the peers held to "
            f"the AVX2 instruction set ({labels[1]}; peers: {avx2.get('peers_note')}; "
            f"{avx2['machine'].get('date')}). The AVX2 run is at N = "
            f"{avx2['config'].get('compare_n')} only, without the crossover; the rows are the "
            f"quantities both runs measured. The Numba kernels size their products by SciPy's "
            f"BLAS kernel (`linattn/numba_cpu/blas_threads.py`); each run's sizes, as it "
            f"recorded them: native: {_sizes(bench['machine'])}; AVX2 mode: "
            f"{_sizes(avx2['machine'])}.\n\n"
            + _table(["quantity", "native", "AVX2 mode"], rows))


def _sizes(machine):
    """The kernel sizes a run recorded (``bench.timing.kernel_sizes``), in words."""
    sizes = machine.get("kernel_sizes")
    if not sizes:
        return "not recorded"
    block_q, block_k = sizes["softmax_tiles"]
    held = ", the BLAS held to one thread" if sizes["blas_held"] else ""
    kernel = (f"OpenBLAS's {sizes['blas_kernel']} kernel" if sizes["blas_kernel"]
              else "a BLAS other than one OpenBLAS")
    return (f"with {kernel}, softmax tiles of "
            f"{block_q} queries by {block_k} keys{held}, causal linear blocks of "
            f"{sizes['chunk_size']} positions (D = M = {sizes['d']})")


def _by_n(rows, key, scale, unit):
    table = _pivot(rows, key, "n", scale)
    ns = sorted({n for by_n in table.values() for n in by_n})
    body = []
    for name, by_n in table.items():
        slope = fitted_slope(rows, name, key)
        body.append([name] + [_sig(by_n.get(n)) for n in ns] + [_sig(slope, 2)])
    return _table(["curve"] + [f"N = {n}" for n in ns] + ["slope"], body), unit


def _time(figures_dir):
    path = figures_dir / "time_vs_n.csv"
    rows, meta = _csv(path)
    if rows is None:
        return _missing("Time against N", path)
    fwd, _ = _by_n(rows, "seconds_fwd", 1e3, "ms")
    both, _ = _by_n(rows, "seconds_fwdbwd", 1e3, "ms")
    text = [f"## Time against N ({_source(path, meta)})", "",
            "Milliseconds per sample: a call's time over its batch, max(1, T / N) with T the "
            "tokens of the shapes above; the median of the calls timed, or, where the first "
            f"forward + backward took over {SLOW:g} s, one call's time in both columns "
            "(`timing.point`). Then the log-log slope over "
            "the larger half of N. The figure: `figures/time_vs_n.png`.", "",
            "Forward:", "", fwd, "", "Forward + backward:", "", both]
    for slow in ("softmax (Numba, tiled)", "softmax (PyTorch SDPA)"):
        if any(r["name"] == slow for r in rows):
            n = crossover_n(rows, slow, "causal linear (Numba)")
            where = f"from N = {n}" if n else "at no N measured"
            text += ["", f"Causal linear attention (Numba) is faster than {slow}, forward + "
                         f"backward per sample, {where}."]
    return "\n".join(text)


def _memory(figures_dir):
    path = figures_dir / "memory_vs_n.csv"
    rows, meta = _csv(path)
    if rows is None:
        return _missing("Peak memory", path)
    table, _ = _by_n(rows, "peak_bytes", 1 / 2**20, "MiB")
    return (f"## Peak memory ({_source(path, meta)})\n\nMiB per sample beyond "
            "the inputs during one forward + backward call: for linattn the peak of its traced "
            "allocations (tracemalloc), for the peers the peak growth of the process's resident "
            "memory, a coarser measure. The figure: "
            "`figures/memory_vs_n.png`.\n\n" + table)


def _tokens(figures_dir):
    path = figures_dir / "time_per_token.csv"
    rows, meta = _csv(path)
    if rows is None:
        return _missing("One generated token", path)
    table = _pivot(rows, "seconds_per_token", "position", 1e6)
    names = list(table)
    positions = sorted({p for by_p in table.values() for p in by_p})
    body = [[p] + [_sig(table[name].get(p)) for name in names] for p in positions]
    return (f"## One generated token ({_source(path, meta)})\n\nMicroseconds for "
            "the token at each position t, with t tokens in the context, itself included (the "
            "RNN: the median of its steps just before t). The figure: "
            "`figures/time_per_token.png`.\n\n" + _table(["position"] + names, body))


def _generation(figures_dir):
    path = figures_dir / "generation_speed.csv"
    rows, meta = _csv(path)
    if rows is None:
        return _missing("Generating images", path)
    body = [[r["name"], r.get("library", "-"), r["batch"], _sig(r.get("seconds_per_image")),
             _sig(r.get("images_per_s")), _sig(r.get("vs_rnn")),
             "measured" if r.get("measured") in (True, "True") else "estimated"]
            for r in rows]
    return (f"## Generating images ({_source(path, meta)})\n\n"
            f"{meta.get('caption', '')}\n\nA form's row measured generates whole images with "
            "`linattn.model.generate` (the peer's with its own RNN, each of its rounds "
            "in turn with one of linattn's RNN); a row estimated times "
            "single tokens at a few prefix lengths; the products alone are the RNN's matrix "
            "products in a loop of their own (below). `vs RNN` is the row's time over "
            "linattn's RNN at the same batch.\n\n"
            + _table(["form", "library", "batch", "s / image", "images / s", "vs RNN", "how"],
                     body, ["---", "---", "---:", "---:", "---:", "---:", "---"])
            + "\n\n" + _generation_modes(figures_dir, rows, meta))


def _generation_modes(figures_dir, native, native_meta):
    """pft's RNN time over linattn's RNN time, and over linattn's token products alone, at
    each batch, from ``native`` (the rows of ``generation_speed.csv``) and from
    ``data/avx2/generation_speed.csv`` (the RNNs alone, every side held to AVX2) side by
    side, each side's instruction set named."""
    from .speed import FLOOR_NAME, NAMES, PEER_NAME
    path = figures_dir / "data" / "avx2" / "generation_speed.csv"
    avx2, avx2_meta = _csv(path)
    no_mode = _no_avx2_mode(figures_dir) if avx2 is None else None
    sides = [(native, native_meta)] + ([] if no_mode else [(avx2 or [], avx2_meta)])

    def seconds(rows, name):
        return {int(r["batch"]): float(r["seconds"]) for r in rows if r["name"] == name}
    ratios, ceilings = [], []           # pft over our RNN, and over its products alone
    for rows, _ in sides:
        ours, pft = seconds(rows, NAMES["recurrent"]), seconds(rows, PEER_NAME)
        floor = seconds(rows, FLOOR_NAME)
        ratios.append({b: pft[b] / ours[b] for b in pft if b in ours})
        ceilings.append({b: pft[b] / floor[b] for b in pft if b in floor})
    intro = ("pft's RNN time over linattn's RNN time, as this CPU runs them and with Numba, "
             "OpenBLAS and torch held to the AVX2 instruction set (`linattn.lab.isa`), in "
             "separate runs")
    if no_mode:
        intro = f"pft's RNN time over linattn's RNN time, as this CPU runs them. {no_mode}"
    if avx2 is not None:
        intro += (f" (the AVX2 run: `{path.relative_to(figures_dir)}`, "
                  f"{avx2_meta.get('date')}; peers: {avx2_meta.get('peers')})")
    text = [intro + ". The products alone are the same token's matrix products, called one "
            "by one from Python (`token_loop.token_products`: at batch 1 the compiled product "
            "row by row, at larger batches NumPy's BLAS) without its attention and element "
            "work, where the RNN runs a whole token as one compiled call (its products at "
            "larger batches through SciPy's BLAS): pft's time over them approximates the "
            "ratio a token whose element work cost nothing would reach. They are timed apart "
            "from the RNN, so each of the two ratios carries its own timings' noise."]
    if avx2 is None and not no_mode:
        text.append(f"Not in this run: `{path.relative_to(figures_dir)}` is missing.")
    batches = sorted({b for by_batch in ratios for b in by_batch})
    if not batches:
        return "\n\n".join(text + ["No run has both RNNs."])

    def recorded(meta, key):
        value = meta.get(key)
        return value if value not in (None, "", "None") else "not recorded"
    body = [[f"pft s / linattn s, batch {b}"] + [_sig(r.get(b)) for r in ratios]
            for b in batches]
    # about the most the ratio can be while a token reads every weight: pft over our products
    body += [[f"pft s / linattn's products alone, batch {b}"] + [_sig(c.get(b))
                                                                  for c in ceilings]
             for b in batches]
    body.append(["linattn instruction set"] + [
        recorded(meta, "instruction_set") if rows else "-" for rows, meta in sides])
    body.append(["pft CPU capability (torch)"] + [
        recorded(meta, "peer_cpu_capability") if rows else "-" for rows, meta in sides])
    return "\n\n".join(text + [_table(["quantity", "native", "AVX2 mode"][:1 + len(sides)],
                                        body)])


def _training_step(figures_dir):
    """One training step against pft, as this CPU runs it and in AVX2 mode side by side
    (``data/train_step.json``, ``data/avx2/train_step.json``), each side's instruction set
    named; a column whose file is missing shows "-" and a line says which file."""
    title = "One training step against pytorch-fast-transformers"
    paths = [figures_dir / "data" / "train_step.json",
             figures_dir / "data" / "avx2" / "train_step.json"]
    results = [_json(p) for p in paths]
    no_mode = _no_avx2_mode(figures_dir) if results[1] is None else None
    if no_mode:                                   # one mode only: this CPU's
        paths, results = paths[:1], results[:1]
    if all(r is None for r in results):
        return (f"## {title}\n\nNot in this run: `python -m linattn.lab.bench.train_step "
                f"--peer-python PATH --out figures/data/train_step.json` writes it.")
    first = next(r for r in results if r is not None)
    by_batch = [{row["batch"]: row for row in r["rows"]} if r else {} for r in results]
    batches = sorted({b for rows in by_batch for b in rows})
    body = []
    for key, quantity in (("pft_over_ours", "pft step / linattn step"),
                          ("ours_s", "linattn s / step"), ("pft_s", "pft s / step")):
        body += [[f"{quantity}, batch {b}"] + [_sig(rows[b].get(key)) if b in rows else "-"
                                               for rows in by_batch] for b in batches]
    body.append(["linattn instruction set"] + [
        isa.label(r["machine"]["instruction_set"])
        if r and r["machine"].get("instruction_set") else "-" for r in results])
    body.append(["pft CPU capability (torch)"] + [
        (r.get("peer_cpu_capability") or "not recorded") if r else "-" for r in results])
    dates = ", ".join(f"`{p.relative_to(figures_dir)}`, {r['machine'].get('date')}, "
                      f"{r['machine'].get('cpu', 'CPU not recorded')}"
                      for p, r in zip(paths, results) if r)
    missing = [f"Not in this run: `{p.relative_to(figures_dir)}` is missing."
               for p, r in zip(paths, results) if r is None]
    how = (f"as this CPU runs it. {no_mode}" if no_mode else
           "twice in separate runs: as this CPU runs it and with Numba, OpenBLAS and torch "
           "held to the AVX2 instruction set (`linattn.lab.isa`)")
    return (f"## {title} ({dates})\n\nThe copy-task model, N = {first['seq_len']}, "
            f"{first['path']} path, measured {how}. Ours: {first['threads']}; peer"
            f"{', in the first run' if len(results) > 1 else ''}: {first['peer']}. Medians "
            f"over {first['rounds']} rounds taken in turn, each the median of "
            f"{first['repeats']} steps.\n\n"
            + "".join(line + "\n\n" for line in missing)
            + _table(["quantity", "native", "AVX2 mode"][:1 + len(results)], body))


def main(argv=None):
    """``python -m linattn.lab.performance_page``: the page from the committed files."""
    parser = argparse.ArgumentParser(prog="python -m linattn.lab.performance_page",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--figures", type=pathlib.Path, default=pathlib.Path("figures"),
                        help="the folder make figures wrote (default: figures)")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="the page (default: docs/performance.md beside figures/)")
    args = parser.parse_args(argv)
    print(write_page(args.figures, args.out or page_path(args.figures)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
