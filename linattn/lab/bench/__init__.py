"""``python -m linattn.lab.bench``: the paper's central claim measured on this machine.

Linear attention's time and memory grow linearly in N, softmax attention's quadratically,
and the RNN form generates each token at a constant cost (Katharopoulos et al. 2020,
arXiv:2006.16236, sections 3.3-3.4 and Fig. 1). One run measures:

- the ceiling: float32 matrix-product GFLOP/s through NumPy, so every result can be read as
  a fraction of what this CPU can do;
- scaling: forward and forward + backward time (median of ``--repeats`` calls after a
  warm-up, or one call each where the first forward + backward takes over ``timing.SLOW``
  seconds: ``timing.point``) and
  peak extra
  memory against N = 2^j, for softmax (NumPy, Numba) and linear attention (non-causal; causal
  by NumPy's loops, NumPy's blocks, Numba's loops, Numba's blocks, and Numba's default);
- the loops-or-blocks crossover of the Numba backend against D = M, and the forms "auto"
  chooses between for a decay and for the delta rule (with the crossover; ``--widths`` with
  no width skips both);
- generation: time per token against position for the RNN step, softmax with a key/value
  cache and recomputing the prefix;
- peers, when an interpreter with torch is given (``--peer-python``): PyTorch's softmax
  attention and pytorch-fast-transformers, run by ``peers`` in a subprocess;
- head to head: the summary's ratios again, in rounds that take each side in turn
  (``head_to_head``), since the tables' cases lie minutes apart on a machine whose load
  comes and goes; with the tiled softmax's products alone (``floors``);
- a summary of ratios computed from the above (``report.summary``).

Writes ``bench.json`` (machine, configuration, every number), ``bench_*.csv`` and a readable
``bench.txt`` into ``--out``; ``--quick`` finishes in well under a minute.
"""
import functools
import json
import os
import subprocess
import sys

import numpy as np
from tqdm import tqdm

from . import cases, floors, report, timing
from .. import isa
from ..._cli_types import (Parser, executable, non_negative_float, out_dir, positive_float,
                          positive_int)
from ...threads import user_environment


def parse(argv):
    p = Parser(prog="python -m linattn bench", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    p.add_argument("--out", type=out_dir, default=os.path.join("figures", "data"),
                   help="output directory")
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument("--heads", type=positive_int, default=8)
    p.add_argument("--dim", type=positive_int, default=64, help="D, query/key width")
    p.add_argument("--value-dim", type=positive_int, default=64, help="M, value width")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--min-n", type=positive_int, default=128, help="smallest N (a power of two)")
    p.add_argument("--max-n", type=positive_int, default=65536,
                   help="largest N (a power of two)")
    p.add_argument("--tokens", type=positive_int, default=None,
                   help="keep batch x N at TOKENS (up to N = TOKENS), batch = "
                        "max(1, TOKENS // N), as the "
                        "paper's Figure 1 does (default: --batch at every N)")
    p.add_argument("--compare-n", type=positive_int, default=4096,
                   help="N of the head-to-head rounds and the summary")
    p.add_argument("--cross-n", type=positive_int, default=4096, help="N of the crossover")
    p.add_argument("--gen-positions", type=positive_int, default=16384)
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--rounds", type=positive_int, default=7, help="rounds of the head-to-head")
    p.add_argument("--budget", type=positive_float, default=30.0,
                   help="seconds; a case stops growing N past one fwd+bwd this slow (with "
                        "--tokens: this slow for TOKENS tokens' work, so a call of batch 1 "
                        "past N = TOKENS gets N / TOKENS times as long)")
    p.add_argument("--pause", type=non_negative_float, default=0.25,
                   help="seconds of rest before each case, for idle threads to sleep")
    p.add_argument("--cases", nargs="+", default=list(cases.SCALING), choices=list(cases.CASES),
                   help="the scaling cases")
    peers_group = p.add_mutually_exclusive_group()
    peers_group.add_argument("--peer-python", type=executable, default=None,
                             help="interpreter with torch (and pytorch-fast-transformers) for "
                                  "the peers (default: this one)")
    peers_group.add_argument("--no-peers", action="store_true")
    p.add_argument("--widths", type=positive_int, nargs="*", default=[16, 32, 64, 128, 256],
                   help="D = M of the crossover (none: skip it, and the auto rules' timings)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--isa", choices=isa.MODES, default=None,
                   help="instruction set of every side: avx2 holds Numba, OpenBLAS and the "
                        "peers to Haswell's (see linattn.lab.isa); default: as this process "
                        "runs")
    cfg = p.parse_args(argv)
    cfg.peer_python = cfg.peer_python or sys.executable
    if cfg.min_n > cfg.max_n:
        p.error(f"argument --min-n: must be at most --max-n ({cfg.max_n}), got {cfg.min_n}")
    if cfg.quick:
        cfg.min_n, cfg.max_n, cfg.compare_n, cfg.cross_n = min(cfg.min_n, 128), 1024, 1024, 512
        cfg.tokens = None if cfg.tokens is None else min(cfg.tokens, 2048)
        cfg.gen_positions, cfg.repeats, cfg.budget, cfg.pause = 1024, 2, 1.0, 0.01
        cfg.rounds = 2
        cfg.widths = [w for w in cfg.widths if w <= 64]
    cfg.ns = [2**j for j in range(max(0, cfg.min_n.bit_length() - 1), cfg.max_n.bit_length())
              if cfg.min_n <= 2**j <= cfg.max_n]
    if cfg.compare_n not in cfg.ns:
        cfg.ns = sorted(set(cfg.ns) | {cfg.compare_n})
    return cfg


def threads(cfg):
    """Best causal forward time at heads = 1 on every Numba thread and on one (the split of
    the sequence into segments between workers), and, as the yardstick, the same for NumPy's
    float32 matrix product of about the same cost. The four calls alternate, so that a busy
    neighbour on a shared machine slows each alike, in 20 rounds or more, each after a pause
    that lets the BLAS threads of the round before stop spinning."""
    import numba
    q, k, v, _ = cases.inputs(cfg.batch, 1, cfg.compare_n, cfg.dim, cfg.value_dim, cfg.dtype)
    forward = cases.CASES["causal numba"][0]
    all_threads = numba.get_num_threads()
    calls = {"all_s": (lambda: numba.set_num_threads(all_threads), lambda: forward(q, k, v)),
             "one_s": (lambda: numba.set_num_threads(1), lambda: forward(q, k, v))}
    blas = timing.blas_limiter()
    a = np.ones((512, 512), np.float32)
    calls["blas_all_s"] = (lambda: blas(None), lambda: a @ a)
    calls["blas_one_s"] = (lambda: blas(1), lambda: a @ a)
    try:
        best = timing.interleaved(calls, max(cfg.repeats, 20), cfg.pause)
    finally:
        numba.set_num_threads(all_threads)
        blas(None)
    return {"threads": all_threads, **best}


def head_to_head(cfg, progress):
    """The summary's ratios measured in ``cfg.rounds`` rounds at ``cfg.compare_n``; each round
    takes in turn: linattn's causal linear attention, forward and forward + backward (best of
    ``cfg.repeats``), the median seconds per token of 1024 RNN steps (the functional
    ``linear_attention_step`` and ``Recurrence.step``) and of 1024 passes over an array the
    size of the state (``np.add``, the floor of a step); the forward and
    forward + backward of each other case of ``cases.PAIRS`` that runs (``--cases``, and
    ``cases.ALWAYS_HEAD_TO_HEAD``), best of ``cfg.repeats``, and the tiled softmax's
    products alone (``floors``); the peers' side of every pair and pft's step (one
    ``peers.py`` subprocess; None without it); and the matmul ceiling. A load that comes
    and goes over seconds to minutes then weighs on both sides of each round's ratios
    alike; the summary takes their median over the rounds."""
    q, k, v, dout = cases.inputs(cfg.batch, cfg.heads, cfg.compare_n, cfg.dim, cfg.value_dim,
                                 cfg.dtype)
    steps = cases.tokens(*cases.inputs(1, cfg.heads, 1024, cfg.dim, cfg.value_dim,
                                       cfg.dtype, seed=1)[:3])
    pairs = [(ours, peer) for ours, peer in cases.PAIRS if ours in cfg.cases
             or ours in cases.ALWAYS_HEAD_TO_HEAD]
    config = {"head_to_head": True, "n": cfg.compare_n, "steps": len(steps[0]),
              "cases": [peer for _, peer in pairs]}
    rounds = []
    for r in range(cfg.rounds):
        cases.advance(progress, f"head to head, round {r + 1}")
        row = {}
        for ours, _ in pairs:
            forward, forward_backward = cases.CASES[ours]
            timing.settle(cfg.pause)
            fwd = timing.seconds(lambda: forward(q, k, v), cfg.repeats)[1]
            both = timing.seconds(lambda: forward_backward(q, k, v, dout), cfg.repeats)[1]
            row.update({f"{ours} forward_s": fwd, f"{ours} forward_backward_s": both})
            if ours in cases.SOFTMAX_FLOORS:          # the same tiles' products alone
                products = functools.partial(floors.softmax_products, q, k, v,
                                             cases.SOFTMAX_FLOORS[ours])
                row[f"{ours} products_s"] = timing.seconds(products, cfg.repeats)[1]
        row["forward_s"] = row["causal numba forward_s"]          # the headline case
        row["forward_backward_s"] = row["causal numba forward_backward_s"]
        row["step_s"] = float(np.median(cases.step_seconds(*steps)))
        row["recurrence_step_s"] = float(np.median(cases.recurrence_seconds(*steps)))
        row["state_pass_s"] = float(np.median(cases.state_pass_seconds(steps[0], steps[2])))
        peer = _peers(cfg, config)[0] or {}
        row["pft_forward_backward_s"] = peer.get("pft causal linear forward_backward_s")
        row["pft_step_s"] = peer.get("step_s")
        for _, name in pairs:
            for key in ("forward_s", "forward_backward_s"):
                row[f"{name} {key}"] = peer.get(f"{name} {key}")
        row["ceiling_gflops"] = timing.matmul_gflops(repeats=3)  # last: its threads spin on
        rounds.append(row)
    return rounds


def peers(cfg):
    """The peers at every N (their step is timed in ``head_to_head``), from ``peers.py`` run by
    ``cfg.peer_python``: (result, note), or (None, why)."""
    result, note = _peers(cfg, {"ns": cfg.ns, "max_linear_n": cfg.max_n,
                                "budget": cfg.budget, "tokens": cfg.tokens})
    if result is None:
        return None, note
    note = (f"torch {result['torch']} ({result['threads']} threads, vector kernels "
            f"{result.get('cpu_capability')})")
    if not result["fast_transformers"]:
        note += ", pytorch-fast-transformers not installed"
    return result, note


def _peers(cfg, config):
    """(``peers.py``'s JSON answer to ``config`` plus the shared sizes, None) or (None,
    why not)."""
    if cfg.no_peers:
        return None, "none ran (--no-peers)"
    probe = subprocess.run([cfg.peer_python, "-c", "import torch"], capture_output=True)
    if probe.returncode != 0:
        return None, (f"none ran: no torch in {cfg.peer_python} (add them with --peer-python "
                      f"PATH, an interpreter with torch and pytorch-fast-transformers)")
    config = {"batch": cfg.batch, "heads": cfg.heads, "dim": cfg.dim,
              "value_dim": cfg.value_dim, "eps": 1e-6, "repeats": cfg.repeats, **config}
    # a fixed mmap threshold: glibc then returns every large array to the system when it is
    # freed, so that the peers' peak resident memory (timing.peak_rss_bytes) follows what
    # they hold instead of what glibc kept from earlier calls
    env = user_environment(MALLOC_MMAP_THRESHOLD_=str(1 << 17))
    env = isa.environment(isa.mode(), env)         # the peers run in this process's mode
    run = subprocess.run([cfg.peer_python, os.path.join(os.path.dirname(__file__), "peers.py"),
                          json.dumps(config)], capture_output=True, text=True, env=env)
    if run.returncode != 0:
        return None, f"failed: {run.stderr.strip().splitlines()[-1:]}"
    return json.loads(run.stdout), None


def main(argv=None):
    cfg = parse(sys.argv[1:] if argv is None else argv)
    if cfg.isa == "avx2" and "avx2" not in isa.cpu_flags():
        raise SystemExit("--isa avx2: this CPU reports no AVX2 (/proc/cpuinfo), so it cannot "
                         "run the AVX2 mode's code; run without --isa")
    if cfg.isa is not None and cfg.isa != isa.mode():
        # Numba and OpenBLAS read their target when they load: run again in the mode asked
        sys.stdout.flush()
        argv = sys.argv[1:] if argv is None else argv
        os.execve(sys.executable, [sys.executable, "-m", "linattn.lab.bench", *argv],
                  isa.environment(cfg.isa))
    os.makedirs(cfg.out, exist_ok=True)
    dtype = np.dtype(cfg.dtype)
    cfg.dtype = dtype.name
    widths = cfg.widths
    total = (len(cfg.ns) * len(cfg.cases) + len(cases.CROSSOVER) * len(widths)
             * len({1, cfg.heads}) + (2 * len(cases.AUTO_RULES) if widths else 0) + 3
             + cfg.gen_positions.bit_length() + cfg.rounds)
    progress = tqdm(total=total, disable=cfg.no_progress, unit="case", desc="bench")
    results = {"machine": timing.machine(), "ceiling_gflops": timing.matmul_gflops(),
               "config": vars(cfg)}
    results["scaling"] = cases.scaling(cfg, progress)
    results["crossover"] = cases.crossover(cfg, progress, widths)
    results["auto_rules"] = cases.auto_rules(cfg, progress) if widths else []
    cases.advance(progress, "heads=1 thread scaling")
    results["threads"] = threads(cfg)
    results["generation"], results["generation_summary"] = cases.generation(cfg, progress)
    cases.advance(progress, "peers")
    results["peers"], results["peers_note"] = peers(cfg)
    results["head_to_head"] = head_to_head(cfg, progress)
    progress.close()
    results["summary"] = report.summary(results)
    with open(os.path.join(cfg.out, "bench.json"), "w") as f:
        json.dump(results, f, indent=1)
    report.write(results, cfg.out)
    print(report.text(results), end="")
    return 0
