"""Generation speed at the paper's MNIST shape: the RNN form against softmax with a
key/value cache and softmax recomputing the prefix, Tables 1, 4 and 5 of Katharopoulos et
al. (2020), arXiv:2006.16236 (section 4.2 and appendix C), and the authors' own recurrent
model (pytorch-fast-transformers, run by ``linattn/lab/bench/peer_generate.py``) when an
interpreter that has it is given.

The model is the paper's MNIST transformer (section 4.2.1): 8 layers, 8 heads of 32,
d_model 256, an MLP of 1024, here with random weights, a vocabulary of 256 grey levels and
greedy decoding (the paper's output is a mixture of logistics; the cost of the last layer is
not what is compared). One image is N = 784 tokens generated after one start token. Every
form calls ``generate``; the three rows differ only in ``method``:

- ``"recurrent"``: linear attention as an RNN, Eq. (16)-(20), O(1) per token;
- ``"cache"``: softmax attention with a key/value cache (the paper's "stateful-softmax",
  appendix C.1, Table 4), O(t) per token at position t;
- ``"recompute"``: softmax attention running the whole prefix again for each token (what
  Tables 1-2 compare with), O(t^2) per token. At the paper's shape a generation takes
  minutes on a small machine, so it is estimated (``estimate_seconds``) unless measuring it, every
  round, fits the budget (at each batch on its own); each row says which.

pft's model runs in its own interpreter, kept open (``Peer``), and its timed generations
alternate with those of linattn's RNN, one round each in turn
(``timing.medians_in_turn``): on a shared machine whose speed drifts over minutes, both
medians then come from the same minutes.

Timing only; correctness is in the tests. Both sides run on ``THREADS`` threads.
"""
import contextlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from .._cli_types import Parser, executable, output_file, positive_float, positive_int
from ..threads import user_environment
from ..model.fast import token_loop
from ..model.config import ModelConfig
from ..model.generate import generate
from ..model.transformer import init_params

# the paper's MNIST model (section 4.2.1), with 256 grey levels as tokens
MNIST = dict(vocab_size=256, d_model=256, n_layers=8, n_heads=8, d_mlp=1024)
N_MNIST = 784                                    # 28 x 28 pixels, one token each
FORMS = (("linear", "recurrent"), ("softmax", "cache"), ("softmax", "recompute"))
NAMES = {"recurrent": "linear, RNN", "cache": "softmax, key/value cache",
         "recompute": "softmax, recomputing the prefix"}
PEER_NAME = "pft linear, RNN"
FLOOR_NAME = "linear, RNN: its matrix products alone"
THREADS = 2
# recomputing at t builds (B, H, t, t) attention matrices: past ~1k they take gigabytes
PROBE_LIMIT = 1024
# seconds between our round and the peer's: threads that spin after a round's work (OpenMP's,
# OpenBLAS's: well under this) stop before the other side starts
PAUSE_S = 0.5
# seconds the peer's process has to exit once its input is closed
EXIT_S = 30
# how the cost of one token grows with its position t: t^0, t^1, t^2
GROWTH = {"recurrent": 0, "cache": 1, "recompute": 2}
# linattn's RNN alone (the form pft has too): the AVX2-mode run's forms
RNN_FORMS = (("linear", "recurrent"),)
PEER_SCRIPT = os.path.join(os.path.dirname(__file__), "bench", "peer_generate.py")


def estimate_seconds(token_seconds, n, growth, probe_limit=PROBE_LIMIT, points=6):
    """Estimated seconds to generate n tokens from the cost of single tokens.

    The cost of the token at position t is measured at ``points`` positions
    0 <= t <= T = min(n - 1, probe_limit), interpolated linearly between them and, past T,
    extrapolated as cost(T) (t / T)^growth; the estimate is the sum over t = 0..n-1.

    Parameters
    ----------
    token_seconds : callable, t -> seconds to generate the token at position t
    n : int, tokens generated
    growth : int, the exponent p of the per-token cost, cost(t) ~ t^p (``GROWTH``)

    Returns
    -------
    seconds : float

    Cost: ``points`` calls of ``token_seconds``, then O(n).
    """
    probes = np.unique(np.linspace(0, min(n - 1, probe_limit), points).astype(int))
    costs = [token_seconds(int(t)) for t in probes]
    t = np.arange(n)
    last = max(int(probes[-1]), 1)
    per_token = np.where(t <= last, np.interp(t, probes, costs),
                         costs[-1] * (t / last) ** growth)
    return float(per_token.sum())


@contextlib.contextmanager
def thread_limit(n):
    """Every BLAS threadpoolctl finds (NumPy's and SciPy's) and Numba on ``n`` threads, each
    restored afterwards; yields a line naming what was set."""
    import numba

    from .bench.timing import blas_limiter
    before = numba.get_num_threads()
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    limit = blas_limiter()
    limit(n)
    try:
        yield f"linattn: BLAS {n}, numba {numba.get_num_threads()} threads"
    finally:
        numba.set_num_threads(before)
        limit(None)


def _timed(f, rounds):
    from .bench.timing import seconds
    return seconds(f, repeats=rounds, warmup=0)[0]


def warm_image(params, cfg, method, batch, n):
    """``image()``: n tokens generated for the batch after a start token (id 0) with
    ``generate``'s ``method``, after a warm-up of a few tokens (which compiles)."""
    prompt = np.zeros((batch, 1), dtype=np.int64)                  # the start token

    def image():
        generate(params, cfg, prompt, n, method=method)
    generate(params, cfg, prompt, min(n, 8), method=method)
    return image


def form_seconds(params, cfg, method, batch, n, rounds, budget_s):
    """(median seconds to generate n tokens for the batch after a start token (id 0) with
    ``generate``'s ``method``, measured?): "recompute" is estimated by ``estimate_seconds``
    when ``rounds`` generations would take over ``budget_s`` by that estimate, and then
    ``measured`` is False."""
    image = warm_image(params, cfg, method, batch, n)
    if method != "recompute":
        return _timed(image, rounds), True
    # the token at position t costs one forward pass over the t + 1 tokens before it
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, n))

    def token_seconds(t):
        return _timed(lambda: generate(params, cfg, tokens[:, :t + 1], 1, method=method),
                      rounds)
    estimate = estimate_seconds(token_seconds, n, GROWTH[method])
    if rounds * estimate <= budget_s:
        return _timed(image, rounds), True
    return estimate, False


def products_seconds(params, cfg, batch, n, rounds):
    """Median seconds of the matrix products of n tokens at ``batch`` and nothing else
    (``token_loop.token_products``, n times): the RNN's floor on this machine, since every token
    reads all the weights. At batch 1 it is the weights' bytes over the memory bandwidth the
    products reach; at batch 16, the BLAS's speed on (N, K) x (K, 16) products."""
    weights = token_loop.prepare(params, cfg, 1)
    buf = token_loop.buffers(cfg, batch, 1)
    for a in (buf.h, buf.heads, buf.hidden):   # the products' inputs: moderate values,
        a.fill(0.01)                           # never NaN, inf or subnormal
    token_loop.token_products(weights, buf)                            # warm-up: compiles

    def image():
        for _ in range(n):
            token_loop.token_products(weights, buf)
    return _timed(image, rounds)


class PeerFailed(RuntimeError):
    """The peer's interpreter could not start, or stopped answering; the message says why."""


class Peer:
    """pft's recurrent model (``peer_generate.py``) in ``peer_python``, kept running so that
    each of its timed generations can be asked for right after one of ours: both sides
    then see the machine as it is at that minute, which on a shared machine drifts.

    ``note``: the line that names its versions, BLAS, threads and vector kernels;
    ``capability``: the vector kernels torch picked (None if it does not say).
    ``seconds(batch)``: one generation of n tokens, timed in the peer's process.
    Raises ``PeerFailed``. Use as a context manager (``close`` ends the process)."""

    def __init__(self, peer_python, shape, n, threads=THREADS):
        config = {"layers": shape["n_layers"], "heads": shape["n_heads"],
                  "d_model": shape["d_model"], "d_mlp": shape["d_mlp"],
                  "vocab": shape["vocab_size"], "n": n, "threads": threads}
        self._errors = tempfile.TemporaryFile(mode="w+")     # read when it fails
        try:
            self._process = subprocess.Popen(
                [peer_python, PEER_SCRIPT, json.dumps(config)], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=self._errors, text=True,
                env=user_environment())
        except OSError as error:                 # no such interpreter, or not executable
            self._errors.close()
            raise PeerFailed(str(error)) from None
        about = self._answer()
        self.note = (f"pytorch-fast-transformers {about['fast_transformers']}, torch "
                     f"{about['torch']}, BLAS {about['blas']}, {about['threads']} threads, "
                     f"CPU capability {about.get('cpu_capability')}")
        self.capability = about.get("cpu_capability")

    def _answer(self):
        line = self._process.stdout.readline()
        if not line:
            self._process.wait()
            self._errors.seek(0)
            last = self._errors.read().strip().splitlines()[-1:]
            self.close()
            raise PeerFailed(f"{last} (exit status {self._process.returncode})")
        return json.loads(line)

    def seconds(self, batch):
        try:
            self._process.stdin.write(json.dumps({"batch": batch}) + "\n")
            self._process.stdin.flush()
        except OSError:                           # it has exited: _answer says why
            pass
        return self._answer()["seconds"]

    def close(self):
        """Close its input (it exits at the end of its requests); kill it if it has not
        exited within ``EXIT_S`` seconds."""
        if self._process.poll() is None:
            self._process.stdin.close()
            try:
                self._process.wait(timeout=EXIT_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._errors.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def speed_table(batches=(1, 16), rounds=3, peer_python=None, budget_s=60.0, shape=None,
                n=N_MNIST, threads=THREADS, forms=FORMS):
    """Images per second of each form in ``FORMS`` (and pft's RNN) at each batch size.

    Parameters
    ----------
    batches : sequence of int
        Images generated together.
    rounds : int
        Timed generations per row; rows hold the median.
    peer_python : str or None
        An interpreter with torch and pytorch-fast-transformers: adds pft's RNN rows, whose
        rounds alternate with those of linattn's RNN (``Peer``,
        ``timing.medians_in_turn``).
    budget_s : float
        The recomputing form is measured, at each batch, when its ``rounds`` generations
        take at most this many seconds by its estimate, else estimated (the single tokens
        the estimate times are spent either way).
    shape : dict or None
        ``ModelConfig`` sizes (default ``MNIST``); ``n`` tokens per image.
    forms : sequence of (attention, method)
        Of ``FORMS``; it must hold linattn's RNN, ("linear", "recurrent"), which every
        row's ``vs_rnn`` divides by (``RNN_FORMS``: it alone, for the AVX2-mode run).

    Returns
    -------
    rows : list of dict
        name, library, batch, seconds (per batch of images), seconds_per_image,
        images_per_s (batch / seconds), measured (True, or False: estimated),
        vs_rnn (seconds / the seconds of linattn's RNN at that batch), n, dtype.
    meta : dict
        machine, threads, peers, dtype, model: strings for captions; instruction_set (ours,
        ``isa.label``) and peer_cpu_capability (torch's vector kernels, None without it).
    """
    from . import isa
    from .bench.timing import machine, medians_in_turn, once
    from .measure import machine_caption
    shape = {**MNIST, **(shape or {})}
    rows, peers, peer, capability = [], {}, None, None
    peer_note = ("none ran (add them with --peer-python PATH, an interpreter with torch and "
                 "pytorch-fast-transformers)")
    with contextlib.ExitStack() as stack, thread_limit(threads) as threads_note:
        if peer_python:
            try:
                peer = stack.enter_context(Peer(peer_python, shape, n, threads))
                peer_note, capability = peer.note, peer.capability
            except PeerFailed as error:
                peer_note = f"failed: {error}"
        where = machine_caption(machine())
        for attention, method in forms:
            cfg = ModelConfig(max_len=n, attention=attention, **shape)
            params = init_params(cfg, seed=0)
            for batch in batches:
                if method == "recurrent" and peer is not None:     # in turn with pft's
                    image = warm_image(params, cfg, method, batch, n)
                    try:
                        seconds, peers[batch] = medians_in_turn(
                            lambda: once(image), lambda: peer.seconds(batch), rounds,
                            PAUSE_S)
                    except PeerFailed as error:
                        peer, peers, peer_note = None, {}, f"failed: {error}"
                        seconds = _timed(image, rounds)
                    measured = True
                else:
                    seconds, measured = form_seconds(params, cfg, method, batch, n, rounds,
                                                     budget_s)
                rows.append(_row(NAMES[method], "linattn", batch, seconds, measured, n,
                                 cfg.dtype))
                if method == "recurrent":
                    rows.append(_row(FLOOR_NAME, "linattn", batch,
                                     products_seconds(params, cfg, batch, n, rounds), True,
                                     n, cfg.dtype))
    for batch, seconds in sorted(peers.items()):
        rows.append(_row(PEER_NAME, "pytorch-fast-transformers", batch, seconds, True, n,
                         "float32"))
    rnn = {r["batch"]: r["seconds"] for r in rows if r["name"] == NAMES["recurrent"]}
    for row in rows:
        row["vs_rnn"] = row["seconds"] / rnn[row["batch"]]
    model = (f"{shape['n_layers']} layers, {shape['n_heads']} heads, d_model "
             f"{shape['d_model']}, d_mlp {shape['d_mlp']}, vocab {shape['vocab_size']}, "
             f"N = {n}, greedy, random weights")
    return rows, {"machine": where, "threads": threads_note,
                  "peers": peer_note, "dtype": "float32", "model": model,
                  "rounds": str(rounds), "instruction_set": isa.label(isa.describe()),
                  "peer_cpu_capability": capability}


def _row(name, library, batch, seconds, measured, n, dtype):
    return {"name": name, "library": library, "batch": batch, "seconds": seconds,
            "seconds_per_image": seconds / batch, "images_per_s": batch / seconds,
            "measured": measured, "n": n, "dtype": dtype}


def format_table(rows, meta):
    """The rows as a plain-text table, with the model, machine and threads under it."""
    head = (f"{'form':<32} {'library':<26} {'batch':>5} {'s / batch':>10} {'s / image':>10} "
            f"{'images/s':>10} {'s / RNN s':>10}  how")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['name']:<32} {r['library']:<26} {r['batch']:>5} "
                     f"{r['seconds']:>10.4g} {r['seconds_per_image']:>10.4g} "
                     f"{r['images_per_s']:>10.4g} {r['vs_rnn']:>10.3g}  "
                     f"{'measured' if r['measured'] else 'estimated'}")
    lines += ["", f"model: {meta['model']}, {meta['dtype']}",
              f"medians over {meta['rounds']} rounds; 's / RNN s': a row's seconds over "
              f"linattn's RNN at the same batch (for pft: pft s / ours s); 'estimated': "
              f"summed from single tokens timed at a few prefix lengths",
              f"machine: {meta['machine']}", f"threads: {meta['threads']}; peers: "
              f"{meta['peers']}"]
    return "\n".join(lines) + "\n"


def main(argv=None):
    """``python -m linattn speed``: images per second of the generation forms at the paper's
    MNIST shape (``speed_table``), printed as a table; ``--csv`` writes its rows."""
    ap = Parser(prog="python -m linattn speed",
                description="Generation speed at the paper's MNIST shape (8 layers, 8 heads, "
                            "d_model 256, N = 784): the RNN form against softmax forms and, "
                            "with --peer-python, pytorch-fast-transformers.")
    ap.add_argument("--batch", type=positive_int, nargs="+", default=[1, 16],
                    help="images generated together (default: 1 16)")
    ap.add_argument("--rounds", type=positive_int, default=3, help="timed generations per row")
    ap.add_argument("--peer-python", type=executable, default=None,
                    help="an interpreter with torch and pytorch-fast-transformers")
    ap.add_argument("--budget", type=positive_float, default=60.0,
                    help="seconds: recomputing the prefix is measured (every round) when its "
                         "estimate says that fits in this, else estimated")
    ap.add_argument("--rnn-only", action="store_true",
                    help="only the RNN forms: linattn's and, with --peer-python, pft's")
    ap.add_argument("--csv", type=output_file, help="also write the rows to this CSV file")
    args = ap.parse_args(argv)
    rows, meta = speed_table(args.batch, args.rounds, args.peer_python, args.budget,
                             forms=RNN_FORMS if args.rnn_only else FORMS)
    print(format_table(rows, meta), end="")
    if args.csv:
        from .figures import GENERATION_COLUMNS, machine, write_csv
        os.makedirs(os.path.dirname(args.csv) or ".", exist_ok=True)
        write_csv(args.csv, rows, GENERATION_COLUMNS,       # the date, then the run's meta
                  {"figure": "generation_speed", **machine(), **meta})
        print(f"wrote {args.csv}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from linattn import threads
    threads.relaunch_configured()       # OpenBLAS reads its thread timeout when it loads
    sys.exit(main())
