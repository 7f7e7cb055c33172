"""The benchmark's outputs: the ratios that summarise one run (to the peers, to this machine's
matmul ceiling, between positions), readable tables, and the CSV files beside the JSON.
They report what was measured; judging it against any threshold is the reader's business."""
import csv
import os

import numpy as np

from .. import isa
from .cases import PAIRS


def _find(rows, name, **where):
    """The first row of the case ``name`` matching ``where``, or None."""
    for row in rows:
        if row["case"] == name and all(row.get(k) == v for k, v in where.items()):
            return row
    return None


def _ratio(num, den):
    return None if num is None or den is None or den == 0 else num / den


def _median(rounds, key):
    """The median of ``key`` over the rounds that measured it, or None."""
    values = [r[key] for r in rounds if r.get(key) is not None]
    return float(np.median(values)) if values else None


def _median_ratio(rounds, num, den):
    """The median over the head-to-head rounds of num(round) / den(round), or None."""
    ratios = [_ratio(num(r), den(r)) for r in rounds]
    ratios = [x for x in ratios if x is not None]
    return float(np.median(ratios)) if ratios else None


def summary(results):
    """[(quantity, value)]: the run's headline ratios; those that compare two measurements
    are medians over the head-to-head rounds (None where a side was not measured)."""
    cfg, scaling, rounds = results["config"], results["scaling"], results["head_to_head"]
    n = cfg["compare_n"]
    flops = 4 * n * cfg["dim"] * cfg["value_dim"] * cfg["batch"] * cfg["heads"]
    ceiling = float(np.median([r["ceiling_gflops"] for r in rounds]))
    threads = results["threads"]
    rows = [(f"{'fwd+bwd' if key == 'forward_backward_s' else 'forward'} N={n}: "
             f"{peer} / {ours}",
             _median_ratio(rounds, lambda r: r.get(f"{peer} {key}"),
                           lambda r: r.get(f"{ours} {key}")))
            for ours, peer in PAIRS for key in ("forward_s", "forward_backward_s")
            if any(r.get(f"{ours} {key}") is not None for r in rounds)]
    rows += [
        (f"causal forward N={n}: fraction of float32 matmul GFLOP/s",
         _median_ratio(rounds, lambda r: flops / r["forward_s"] / 1e9,
                       lambda r: r["ceiling_gflops"])),
        (f"causal forward N={n}, heads=1: fraction of matmul GFLOP/s",
         _ratio(flops / cfg["heads"] / threads["all_s"] / 1e9, ceiling)),
        (f"causal forward N={n}, heads=1: {threads['threads']} threads / 1 thread speedup",
         _ratio(threads["one_s"], threads["all_s"])),
    ]
    # causal softmax's two products, q k^T and P v, over the N^2 / 2 pairs (i, j <= i)
    softmax_flops = n * n * (cfg["dim"] + cfg["value_dim"]) * cfg["batch"] * cfg["heads"]
    rows += [(f"{name} forward N={n}: fraction of float32 matmul GFLOP/s",
              _median_ratio(rounds, lambda r, name=name: _ratio(
                  softmax_flops / 1e9, r.get(f"{name} forward_s")),
                  lambda r: r["ceiling_gflops"]))
             for name in ("softmax numba", "torch softmax")
             if any(r.get(f"{name} forward_s") is not None for r in rounds)]
    for ours, peer in PAIRS:                # the tiled softmax's products alone (floors)
        if not any(r.get(f"{ours} products_s") is not None for r in rounds):
            continue
        rows += [(f"{ours} forward N={n}: its products alone / the whole forward",
                  _median_ratio(rounds, lambda r, o=ours: r.get(f"{o} products_s"),
                                lambda r, o=ours: r.get(f"{o} forward_s"))),
                 (f"forward N={n}: {peer} / {ours}'s products alone",
                  _median_ratio(rounds, lambda r, p=peer: r.get(f"{p} forward_s"),
                                lambda r, o=ours: r.get(f"{o} products_s")))]
    big = max((r for r in scaling if r["case"] == "causal numba"), key=lambda r: r["n"],
              default=None)
    if big is not None:
        batch = big.get("batch") or cfg["batch"]
        inputs = 2 * (cfg["dim"] + cfg["value_dim"]) * big["n"] * batch * cfg["heads"]
        inputs *= np.dtype(cfg["dtype"]).itemsize
        rows.append((f"causal fwd+bwd N={big['n']}: peak extra memory / bytes of q,k,v,dout",
                     _ratio(big["peak_extra_bytes"], inputs)))
    gen, gen_summary = results["generation"], results["generation_summary"]
    last = cfg["gen_positions"]
    step = _find(gen, "rnn step", position=last)
    cache = min((r["seconds_per_token"] for r in gen
                 if r["case"].startswith("softmax kv-cache") and r["position"] == last),
                default=None)
    rows += [
        (f"one step, {cfg['heads']} heads: pft RecurrentLinearAttention / numba",
         _median_ratio(rounds, lambda r: r["pft_step_s"], lambda r: r["step_s"])),
        (f"one step, {cfg['heads']} heads: pft RecurrentLinearAttention / Recurrence.step",
         _median_ratio(rounds, lambda r: r["pft_step_s"], lambda r: r.get("recurrence_step_s"))),
        ("Recurrence.step / one pass over the state (np.add)",
         _median_ratio(rounds, lambda r: r.get("recurrence_step_s"),
                       lambda r: r.get("state_pass_s"))),
        (f"step time, last 1024 / first 1024 of {last} tokens",
         _ratio(gen_summary["last_1024_median_s"], gen_summary["first_1024_median_s"])),
        (f"per token at position {last}: softmax kv-cache / rnn step",
         _ratio(cache, step and step["seconds_per_token"])),
    ]
    return rows


def _table(header, rows):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(f"{c!s:>{w}}" for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _fmt(x, scale=1.0, digits=2):
    return "-" if x is None else f"{x * scale:.{digits}f}"


def text(results):
    """The run as plain-text tables: machine, summary, scaling, generation, crossover."""
    m, cfg = results["machine"], results["config"]
    parts = [f"machine: {m['cpu']}, {m['cores_available']} cores, numpy {m['numpy']}, "
             f"numba {m['numba']} ({m['numba_threads']} threads), BLAS {m['blas']}",
             f"instruction set: {isa.label(m['instruction_set'])}"
             if m.get("instruction_set") else "instruction set: not recorded",
             f"float32 matmul ceiling: {results['ceiling_gflops']:.1f} GFLOP/s; "
             f"batch={cfg['batch']} heads={cfg['heads']} D={cfg['dim']} M={cfg['value_dim']} "
             f"{cfg['dtype']}; peers: {results['peers_note']}", "", "summary"]
    parts.append(_table(["quantity", "measured"],
                        [(t, "not measured" if v is None else _fmt(v))
                         for t, v in results["summary"]]))
    threads = results["threads"]
    blas = _ratio(threads["blas_one_s"], threads["blas_all_s"])
    if blas is not None:
        parts.append(f"(the yardstick, in turn with the heads=1 calls: NumPy's float32 "
                     f"matmul, {threads['threads']} threads / 1 thread = {blas:.2f})")
    n = cfg["compare_n"]
    table = [[i + 1, _fmt(r["ceiling_gflops"], 1, 1), _fmt(r["forward_s"], 1e3),
              _fmt(r["forward_backward_s"], 1e3), _fmt(r["pft_forward_backward_s"], 1e3),
              _fmt(r["step_s"], 1e6, 1), _fmt(r["pft_step_s"], 1e6, 1)]
             for i, r in enumerate(results["head_to_head"])]
    parts += ["", f"head to head at N={n}, each side in turn (best times; step: median "
              "us per token)",
              _table(["round", "GFLOP/s", "fwd ms", "fwd+bwd ms", "pft fwd+bwd ms",
                      "step us", "pft step us"], table)]
    parts += ["", _step_lines(results)]
    pair_rows = []
    for ours, peer in PAIRS:
        cells = [_median(results["head_to_head"], f"{name} {key}")
                 for key in ("forward_s", "forward_backward_s") for name in (ours, peer)]
        if any(c is not None for c in cells):
            pair_rows.append([ours, peer] + [_fmt(c, 1e3, 1) for c in cells])
    parts += ["", f"pairs at N={n}: medians over the rounds of the best times, ms",
              _table(["ours", "peer", "fwd", "peer fwd", "fwd+bwd", "peer fwd+bwd"],
                     pair_rows)]
    rows = results["scaling"] + (results.get("peers") or {}).get("scaling", [])
    cases = list(dict.fromkeys(r["case"] for r in rows))
    ns = sorted({r["n"] for r in rows})
    for key, title, scale in (("forward_s", "forward, ms", 1e3),
                              ("forward_backward_s", "forward + backward, ms", 1e3),
                              ("peak_extra_bytes", "peak extra memory of fwd+bwd, MiB",
                               2.0**-20)):
        table = [[n] + [_fmt((_find(rows, c, n=n) or {}).get(key), scale, 1) for c in cases]
                 for n in ns]
        parts += ["", title, _table(["N"] + cases, table)]
    gen = results["generation"]
    gcases = list(dict.fromkeys(r["case"] for r in gen))
    positions = sorted({r["position"] for r in gen})
    table = [[t] + [_fmt((_find(gen, c, position=t) or {}).get("seconds_per_token"), 1e6, 1)
                    for c in gcases] for t in positions]
    parts += ["", "generation: microseconds per token at each position",
              _table(["position"] + gcases, table)]
    cross = results["crossover"]
    if cross:
        table = [[r["heads"], r["width"], r["case"], _fmt(r["forward_backward_s"], 1e3, 1)]
                 for r in cross]
        parts += ["", f"loops or blocks: causal fwd+bwd ms at N={cfg['cross_n']}",
                  _table(["heads", "D=M", "case", "ms"], table)]
    return "\n".join(parts) + "\n"


def _step_lines(results):
    """One generated token at batch 1: the medians over the head-to-head rounds of the
    median microseconds per call of each step, and their ratios."""
    cfg, rounds = results["config"], results["head_to_head"]
    ours, pft = _median(rounds, "recurrence_step_s"), _median(rounds, "pft_step_s")
    floor, functional = _median(rounds, "state_pass_s"), _median(rounds, "step_s")
    return "\n".join([
        f"one RNN step, batch 1, {cfg['heads']} heads, D={cfg['dim']} M={cfg['value_dim']} "
        f"{cfg['dtype']}, one thread each (median us per call):",
        f"  Recurrence.step {_fmt(ours, 1e6)}, linear_attention_step {_fmt(functional, 1e6)}, "
        f"pft RecurrentLinearAttention {_fmt(pft, 1e6)}: pft / Recurrence.step = "
        f"{_fmt(_ratio(pft, ours))}",
        f"  floor, one np.add(state, 1, out=state) over an array the size of S and z: "
        f"{_fmt(floor, 1e6)}; Recurrence.step / floor = {_fmt(_ratio(ours, floor))}"])


def write(results, out_dir):
    """results.json is written by the caller; here the CSV files and bench.txt."""
    for key in ("scaling", "generation", "crossover", "auto_rules"):
        rows = results.get(key, [])
        if key == "scaling":
            rows = rows + (results.get("peers") or {}).get("scaling", [])
        if not rows:
            continue
        fields = list(dict.fromkeys(k for r in rows for k in r))
        with open(os.path.join(out_dir, f"bench_{key}.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)
    with open(os.path.join(out_dir, "bench.txt"), "w") as f:
        f.write(text(results))
