"""``python -m linattn.lab.bench.train_step``: one training step of the paper's copy-task model,
linattn against the paper authors' own, head to head.

The model is that of section 4.1 of Katharopoulos et al. (2020), arXiv:2006.16236: 4 layers,
8 heads of 32 (d_model 256), an MLP of 1024, causal linear attention with elu+1, N = 127
positions of the copy task, float32. One step is the forward, the backward and the Adam
update (with clipping). Ours is ``paths.loss_and_grads`` and ``paths.adam_update`` (the
lean path by default); the peer is pytorch-fast-transformers' ``TransformerEncoder``
(``peer_train``, run by ``--peer-python``) with autograd and ``torch.optim.Adam``.

The two models match in layers, widths, heads, feature map, eps, learned positions, token
embedding, output projection and weighted cross-entropy, and both clip the gradient's norm
to 1. They differ in:
- the block: pft's encoder layer is post-norm, x = LN1(x + A(x)), x = LN2(x + f(x)); ours is
  pre-norm, x = x + A(LN1(x)), x = x + f(LN2(x)); both have two layer norms per layer and a
  final one (pft's ``final_normalization``), so the work is the same;
- GELU: pft's is the exact one, x Phi(x) (erf); ours the tanh form;
- Adam: ours ramps the learning rate up over the first steps (a scalar per step);
- initialisation (PyTorch's defaults against ours), which does not change the work.

The sides take turns for ``--rounds`` rounds (each side's round is the median of
``--repeats`` steps after one untimed step), so that a shared machine's changing load
falls on both; the table shows the median over rounds. Both sides run on ``--threads``
threads: ours sets Numba's and the BLAS's (threadpoolctl), the peer torch's.
"""
import json
import os
import subprocess
import sys

import numpy as np

from . import timing
from .. import isa
from ..._cli_types import Parser, executable, new_file, non_negative_float, positive_int
from ...threads import keep_freed_memory, user_environment
from ...model.optim import AdamConfig, adam_init
from ...model.paths import PATHS, adam_update, loss_and_grads
from ...model.tasks import batch_rng
from ...model.train import PAPER_COPY, copy_setup
from ...model.transformer import init_params

ADAM = AdamConfig(lr=1e-3)
PEER = os.path.join(os.path.dirname(__file__), "peer_train.py")


def parse(argv):
    p = Parser(prog="python -m linattn.lab.bench.train_step",
               description=__doc__.split("\n")[0])
    peers = p.add_mutually_exclusive_group()
    peers.add_argument("--peer-python", type=executable, default=None,
                       help="interpreter with torch and pytorch-fast-transformers (default: "
                            "this one)")
    peers.add_argument("--no-peers", action="store_true")
    p.add_argument("--batch", type=positive_int, nargs="+", default=[16, 64])
    p.add_argument("--rounds", type=positive_int, default=5)
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="timed steps per side and round")
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--path", choices=PATHS, default="lean",
                   help="our training path (linattn.model.paths)")
    p.add_argument("--pause", type=non_negative_float, default=0.2,
                   help="seconds of rest before each side's round, for idle threads to sleep")
    for name, value in PAPER_COPY.items():
        p.add_argument("--" + name.replace("_", "-"), type=positive_int, default=value,
                       help="model size (the paper's copy task by default)")
    p.add_argument("--out", type=new_file, help="also write every number to this JSON file")
    cfg = p.parse_args(argv)
    cfg.peer_python = cfg.peer_python or sys.executable
    return cfg


def set_threads(n):
    """Numba's and the BLAS's threads to ``n``; returns the line naming them."""
    import numba
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    timing.blas_limiter()(n)
    return timing.thread_counts()


class Ours:
    """Our model and optimiser, stepping on fixed batches."""

    def __init__(self, cfg, task, model_cfg, batches):
        self.cfg, self.model_cfg, self.batches = cfg, model_cfg, batches
        self.params = init_params(model_cfg, seed=0)
        self.state = adam_init(self.params)
        keep_freed_memory()                  # as the training command does

    def step(self, b):
        loss, grads = loss_and_grads(self.params, self.model_cfg, *self.batches[b],
                                     path=self.cfg.path)
        self.params, self.state, _ = adam_update(self.params, grads, self.state, ADAM,
                                                 path=self.cfg.path)
        return loss

    def round(self, b, repeats):
        return timing.seconds(lambda: self.step(b), repeats)[0]


class Peer:
    """``peer_train.py`` in a subprocess, asked for one round at a time."""

    def __init__(self, cfg, model_cfg, batches):
        self.proc = subprocess.Popen([cfg.peer_python, PEER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=user_environment())
        config = {"threads": cfg.threads, "vocab_size": model_cfg.vocab_size,
                  "max_len": model_cfg.max_len, "d_model": model_cfg.d_model,
                  "n_layers": model_cfg.n_layers, "n_heads": model_cfg.n_heads,
                  "d_mlp": model_cfg.d_mlp, "lr": ADAM.lr,
                  "batches": {b: [a.tolist() for a in arrays] for b, arrays in batches.items()}}
        self.about = self._ask(config)

    def _ask(self, message):
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the peer stopped (exit code {self.proc.wait()}); its error "
                               "is above")
        return json.loads(line)

    def round(self, b, repeats):
        return self._ask({"batch": b, "repeats": repeats})["median_s"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def start_peer(cfg, model_cfg, batches):
    """(Peer, note) or (None, why not)."""
    if cfg.no_peers:
        return None, "none ran (--no-peers)"
    probe = subprocess.run([cfg.peer_python, "-c", "import torch, fast_transformers"],
                           capture_output=True)
    if probe.returncode != 0:
        return None, (f"none ran: no torch and pytorch-fast-transformers in "
                      f"{cfg.peer_python} (add them with --peer-python PATH)")
    peer = Peer(cfg, model_cfg, batches)
    return peer, (f"pft: torch {peer.about['torch']}, {peer.about['threads']} threads, "
                  f"CPU capability {peer.about.get('cpu_capability')}, {cfg.peer_python}")


def measure(cfg):
    """{"machine", "threads", "peer", "peer_cpu_capability", "rows": [{batch, ours_s, pft_s,
    pft_over_ours, ours_rounds_s, pft_rounds_s}]}: medians over rounds, each side's round a
    median. Our instruction set is ``machine["instruction_set"]`` (``isa.describe``); the
    peer's, the vector kernels torch picked (None when no peer ran)."""
    threads = set_threads(cfg.threads)
    task, model_cfg = copy_setup("linear", paper=True, variable=True,
                                 **{k: getattr(cfg, k) for k in PAPER_COPY})
    batches = {b: task.batch(batch_rng(0, b), b) for b in cfg.batch}
    ours = Ours(cfg, task, model_cfg, batches)
    peer, note = start_peer(cfg, model_cfg, batches)
    times = {b: {"ours": [], "pft": []} for b in cfg.batch}
    try:
        for r in range(cfg.rounds):
            for b in cfg.batch:
                sides = [("ours", ours)] + ([("pft", peer)] if peer else [])
                for name, side in sides if r % 2 == 0 else sides[::-1]:   # alternate who starts
                    timing.settle(cfg.pause)
                    times[b][name].append(side.round(b, cfg.repeats))
    finally:
        if peer:
            peer.close()
    rows = []
    for b in cfg.batch:
        ours_s = float(np.median(times[b]["ours"]))
        pft_s = float(np.median(times[b]["pft"])) if peer else None
        rows.append({"batch": b, "ours_s": ours_s, "pft_s": pft_s,
                     "pft_over_ours": None if pft_s is None else pft_s / ours_s,
                     "ours_rounds_s": times[b]["ours"], "pft_rounds_s": times[b]["pft"]})
    return {"machine": timing.machine(), "threads": threads, "peer": note,
            "peer_cpu_capability": peer.about.get("cpu_capability") if peer else None,
            "model": model_cfg._asdict(), "seq_len": task.seq_len, "path": cfg.path,
            "rounds": cfg.rounds, "repeats": cfg.repeats, "rows": rows}


def table(result):
    """The readable report: machine, threads, then batch | ours | pft | pft/ours."""
    m = result["machine"]
    blas = "; ".join(timing.blas_label(b) for b in m["blas"]) if isinstance(m["blas"], list) \
        else m["blas"]
    model = result["model"]
    lines = [f"training step, copy task N = {result['seq_len']}: {model['n_layers']} layers, "
             f"{model['n_heads']} heads, d_model {model['d_model']}, d_mlp {model['d_mlp']}, "
             f"float32, forward + backward + Adam; ours: {result['path']} path",
             f"machine: {m['cpu']}, {m['cores_available']} cores; numpy {m['numpy']}, numba "
             f"{m['numba']}; BLAS: {blas}",
             f"ours: {result['threads']}", f"peer: {result['peer']}",
             f"instruction set: ours {isa.label(m['instruction_set'])}; pft "
             f"{result['peer_cpu_capability'] or '-'}",
             f"medians over {result['rounds']} rounds taken in turn, each the median of "
             f"{result['repeats']} steps",
             f"{'batch':>5}  {'ours s/step':>11}  {'pft s/step':>10}  {'pft/ours':>8}"]
    for row in result["rows"]:
        pft = "-" if row["pft_s"] is None else f"{row['pft_s']:.4f}"
        ratio = "-" if row["pft_over_ours"] is None else f"{row['pft_over_ours']:.2f}"
        lines.append(f"{row['batch']:>5}  {row['ours_s']:>11.4f}  {pft:>10}  {ratio:>8}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    cfg = parse(sys.argv[1:] if argv is None else argv)
    result = measure(cfg)
    if cfg.out:
        with open(cfg.out, "w") as f:
            json.dump(result, f, indent=1)
    print(table(result), end="")
    return 0


if __name__ == "__main__":
    from linattn import threads
    threads.relaunch_configured()       # OpenBLAS reads its thread timeout when it loads
    sys.exit(main())
