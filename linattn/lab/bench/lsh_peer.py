"""Reformer (LSH) attention, the paper's second baseline (Katharopoulos et al. 2020,
arXiv:2006.16236, section 4), against pytorch-fast-transformers' ``ReformerAttention``:
forward and forward + backward at the same N, heads, widths, chunk size and rounds, float32.

``python -m linattn.lab.bench.lsh_peer --peer-python PATH`` times linattn's Numba backend here and
pft in a subprocess (``PATH lsh_peer.py CONFIG``; that side never imports linattn), taking
each side in turn ``--turns`` times, so that a shared machine's load weighs on both alike,
and prints each side's medians and ranges over the turns (each turn's value the median of
``--repeats`` calls after a warm-up) and the ratios turn by turn, for each ``--n-hashes``.
``--scaling`` measures linattn's forward + backward time and peak NumPy memory
(``timing.peak_bytes``) against N instead, and fits their log-log slopes.

Both sides use ``--threads`` threads (Numba's; torch's through OMP_NUM_THREADS). On a
machine whose cores other processes keep busy, OpenMP's default of spinning while it waits
costs milliseconds a parallel loop on either side; OMP_WAIT_POLICY=passive in the
environment avoids that (both sides read it).

What differs: pft hashes with ``bits`` fresh random planes per call, 2 bits buckets whatever
N; linattn's buckets default to 2 N / C (``--n-buckets`` sets them, 2 bits to match), and
linattn's backward recomputes the forward (pft keeps autograd's tensors). pft runs without
dropout and with ``masked=False`` (its ``masked=True`` adds an N x N matrix); full lengths.
"""
import json
import os
import statistics
import subprocess
import sys
import timeit

from ..._cli_types import Parser, executable, non_negative_int, positive_int


def _median(f, repeats):
    """Median wall time of ``repeats`` calls of ``f()`` after one warm-up call."""
    f()
    return statistics.median(timeit.repeat(f, number=1, repeat=repeats))


def pft_seconds(config):
    """pft's forward and forward + backward median seconds (run by the peer's Python)."""
    import torch
    from fast_transformers.attention import ReformerAttention
    from fast_transformers.masking import FullMask, LengthMask
    torch.set_num_threads(config["threads"])
    n, h, d = config["n"], config["heads"], config["dim"]
    attention = ReformerAttention(chunk_size=config["chunk_size"], bits=config["bits"],
                                  rounds=config["rounds"], masked=False, attention_dropout=0.0)
    gen = torch.Generator().manual_seed(0)
    qk = torch.randn(1, n, h, d, generator=gen).requires_grad_()     # (batch, N, heads, D)
    v = torch.randn(1, n, h, d, generator=gen).requires_grad_()
    dout = torch.randn(v.shape, generator=gen)
    full, lengths = FullMask(n), LengthMask(torch.full((1,), n, dtype=torch.int64))

    def forward():
        with torch.no_grad():
            attention(qk, qk, v, full, lengths, lengths)

    def both():
        qk.grad = v.grad = None
        attention(qk, qk, v, full, lengths, lengths).backward(dout)
    return {"forward_s": _median(forward, config["repeats"]),
            "forward_backward_s": _median(both, config["repeats"])}


def _ours(config, n):
    """linattn's inputs at N = n, float32 ((1, heads, N, D) qk, v, dout), and keywords."""
    import numpy as np
    rng = np.random.default_rng(0)
    qk, v, dout = (rng.standard_normal((1, config["heads"], n, config["dim"]),
                                       dtype=np.float32) for _ in range(3))
    kw = dict(n_hashes=config["rounds"], chunk_size=config["chunk_size"],
              n_buckets=config["n_buckets"], backend="numba")
    return (qk, v, dout), kw


def ours_seconds(config, n):
    """linattn's (Numba) forward, backward and forward + backward median seconds."""
    import linattn
    (qk, v, dout), kw = _ours(config, n)

    def forward():
        return linattn.lsh_attention(qk, v, **kw)

    def backward():
        return linattn.lsh_attention_backward(dout, qk, v, **kw)
    return {"forward_s": _median(forward, config["repeats"]),
            "backward_s": _median(backward, config["repeats"]),
            "forward_backward_s": _median(lambda: (forward(), backward()), config["repeats"])}


def head_to_head(config, peer_python, turns):
    """{side: [one dict of seconds per turn]}, linattn then pft in each turn."""
    # here, not at the top: the peer's side has no linattn
    from ...threads import user_environment
    script = os.path.abspath(__file__)
    sides = {"linattn": [], "pft": []}
    for _ in range(turns):
        sides["linattn"].append(ours_seconds(config, config["n"]))
        run = subprocess.run([peer_python, script, json.dumps(config)], capture_output=True,
                             text=True, check=True, env=user_environment())
        sides["pft"].append(json.loads(run.stdout))
    return sides


def scaling(config, ns):
    """[(N, forward + backward median seconds, peak NumPy bytes)] and the two log-log slopes."""
    import numpy as np
    import linattn
    from . import timing
    rows = []
    for n in ns:
        (qk, v, dout), kw = _ours(config, n)
        both = _median(lambda: (linattn.lsh_attention(qk, v, **kw),
                                linattn.lsh_attention_backward(dout, qk, v, **kw)),
                       config["repeats"])
        peak = timing.peak_bytes(lambda: (linattn.lsh_attention(qk, v, **kw),
                                          linattn.lsh_attention_backward(dout, qk, v, **kw)))
        rows.append((n, both, peak))
    logn = np.log2([r[0] for r in rows])
    slopes = [float(np.polyfit(logn, np.log2([r[k] for r in rows]), 1)[0]) for k in (1, 2)]
    return rows, slopes


def main(argv=None):
    p = Parser(prog="python -m linattn.lab.bench.lsh_peer",
               description=__doc__.split("\n")[0])
    p.add_argument("--peer-python", type=executable, default=sys.executable)
    p.add_argument("--n", type=positive_int, default=4096)
    p.add_argument("--heads", type=positive_int, default=8)
    p.add_argument("--dim", type=positive_int, default=64,
                   help="D = M (the peer's v is D wide too)")
    p.add_argument("--chunk-size", type=positive_int, default=32)
    p.add_argument("--n-hashes", type=positive_int, nargs="+", default=[1, 4],
                   help="hash rounds")
    p.add_argument("--bits", type=positive_int, default=32, help="pft's hyperplanes")
    p.add_argument("--n-buckets", type=positive_int, default=None,
                   help="linattn's, even (default 2 N / C)")
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--turns", type=positive_int, default=5, help="turns of each side")
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--scaling", type=non_negative_int, nargs=2,
                   metavar=("LOG2_MIN", "LOG2_MAX"))
    cfg = p.parse_args(argv)
    if cfg.n_buckets is not None and cfg.n_buckets % 2:
        p.error(f"argument --n-buckets: must be even, got {cfg.n_buckets}")
    if cfg.scaling and cfg.scaling[0] > cfg.scaling[1]:
        p.error(f"argument --scaling: LOG2_MIN must be at most LOG2_MAX, got {cfg.scaling}")
    import numba
    numba.set_num_threads(cfg.threads)
    os.environ["OMP_NUM_THREADS"] = str(cfg.threads)                 # the peer's, if unset
    for rounds in cfg.n_hashes:
        config = {"n": cfg.n, "heads": cfg.heads, "dim": cfg.dim,
                  "chunk_size": cfg.chunk_size, "bits": cfg.bits, "n_buckets": cfg.n_buckets,
                  "rounds": rounds, "threads": cfg.threads, "repeats": cfg.repeats}
        if cfg.scaling:
            rows, slopes = scaling(config, [2**j for j in range(cfg.scaling[0],
                                                                 cfg.scaling[1] + 1)])
            for n, s, peak in rows:
                print(f"{rounds} round(s) N={n}: forward + backward {s:.3f} s, "
                      f"peak {peak / 2**20:.1f} MiB")
            print(f"{rounds} round(s) log-log slopes: time {slopes[0]:.3f}, "
                  f"memory {slopes[1]:.3f}")
            continue
        sides = head_to_head(config, cfg.peer_python, cfg.turns)
        for side, rows in sides.items():
            print(f"{rounds} round(s) {side}: " + "; ".join(
                f"{key[:-2]} {statistics.median(r[key] for r in rows):.3f} s "
                f"[{min(r[key] for r in rows):.3f}-{max(r[key] for r in rows):.3f}]"
                for key in rows[0]))
        for key in ("forward_s", "forward_backward_s"):
            ratios = [p[key] / o[key] for o, p in zip(sides["linattn"], sides["pft"])]
            print(f"{rounds} round(s) pft / linattn {key[:-2]}: median "
                  f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]")


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1].startswith("{"):
        print(json.dumps(pft_seconds(json.loads(sys.argv[1]))))          # the peer's side
    else:
        main()
