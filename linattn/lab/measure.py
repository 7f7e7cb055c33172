"""Measurements that produce the rows of ``linattn.lab.figures``: each function computes, the
figure functions only draw. For Katharopoulos et al. (2020), arXiv:2006.16236.

- ``feature_map_error_rows``: feature maps against softmax (Eq. 2-4), for
  ``figures.feature_map_error``;
- ``copy_task_rows``: loss curves of a linear and a softmax transformer trained on the copy
  task (section 4.1, figure 2 of the paper), for ``figures.copy_task_loss``.

- ``speech_rows``: validation PER curves and a Table-3-style table of the speech experiment
  (section 4.3, table 3 of the paper) on a SYNTHETIC stand-in for WSJ, for
  ``figures.speech_per``;
- ``retrieval_rows``: one attention layer trained to recall P key/value pairs (Schlag et
  al. 2021), for ``figures.retrieval_capacity``;
- ``benchmark_rows``: time, memory and time per generated token from one run of
  ``linattn.lab.bench`` (sections 3.3-3.4, figure 1 of the paper), for ``figures.time_vs_n``,
  ``figures.memory_vs_n`` and ``figures.time_per_token``.

Nothing here draws or imports matplotlib; the figures and the notebooks call these functions.
"""
import csv
import json
import os

import numpy as np

from . import isa
from .bench.timing import blas_label
from ..feature_maps import Favor, Taylor
from ..linear import linear_attention
from ..model.train import DEFAULT_ADAM, TrainConfig, copy_task_curves, read_log
from ..softmax import softmax_attention


def _relative(got, want):
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def feature_map_error_rows(n_features=(4, 16, 64, 256, 1024, 4096), seeds=range(8), n=128,
                           d=16, m=16, scale=0.5, data_seed=0):
    """Rows for ``figures.feature_map_error`` on one random q, k, v: q, k = ``scale`` *
    N(0, 1) of shape (N, D), v = N(0, 1) of shape (N, M).

    FAVOR+ (``Favor``) at each F and seed, against the softmax kernel exp(q.k / sqrt(D)) and
    softmax attention; the deterministic maps once, at their own F: Taylor (q, k scaled by
    D^(-1/4), so its kernel is the 2nd-order expansion of that exp), elu+1 and relu (other
    kernels: output error only). One FAVOR feature's relative variance is
    exp(|q' + k'|^2) - 1 with x' = x / D^(1/4): raise ``scale`` to see the error grow.

    Returns
    -------
    rows : list of dict
        name, n_features, seed, scale, kernel_error, output_error.

    Cost: O(len(n_features) len(seeds) N^2 F).
    """
    rng = np.random.default_rng(data_seed)
    q, k = scale * rng.standard_normal((2, n, d))
    v = rng.standard_normal((n, m))
    exact = np.exp(q @ k.T / np.sqrt(d))     # (N, N): the sim of Eq. (3) that gives Eq. (2)
    soft = softmax_attention(q, k, v)
    rows = []

    def add(name, f, seed, kernel, out):
        rows.append({"name": name, "n_features": f, "seed": seed, "scale": scale,
                     "kernel_error": None if kernel is None else _relative(kernel, exact),
                     "output_error": _relative(out, soft)})

    for f in n_features:
        for seed in seeds:
            phi = Favor(f, seed)
            add("favor", f, seed, phi.forward(q) @ phi.forward(k).T,
                linear_attention(q, k, v, feature_map=phi))
    qs, ks = q * d ** -0.25, k * d ** -0.25
    taylor = Taylor()
    add("taylor", 1 + d + d * d, None, taylor.forward(qs) @ taylor.forward(ks).T,
        linear_attention(qs, ks, v, feature_map=taylor))
    for name in ("elu+1", "relu"):
        add(name, d, None, None, linear_attention(q, k, v, feature_map=name))
    return rows


def copy_task_rows(out_dir, steps=1000, batch_size=32, eval_every=50, seed=0, length=12,
                   attentions=("linear", "softmax"), adam=DEFAULT_ADAM, **setup):
    """Train each attention on the copy task and return the loss curves as rows for
    ``figures.copy_task_loss``: the data of figure 2 of the paper, at a NumPy budget.

    The defaults are the settings of ``figures/copy_task_loss.png``: strings of up to
    ``length`` = 12 symbols (N = 25 positions), the model of ``model.train.DEFAULT_COPY``
    (2 layers, 4 heads of 16), batches of 32, Adam at 3e-3, 1000 steps.

    Parameters
    ----------
    out_dir : str or os.PathLike
        Each run's ``checkpoint.npz`` and ``log.csv`` go to ``out_dir/ATTENTION`` (see
        ``model.train.copy_task_curves``, which trains them afresh, never reusing a run).
    steps, batch_size, eval_every, seed : int
        Of ``model.train.TrainConfig``; held-out loss every ``eval_every`` steps.
    length : int
        Longest string to copy.
    attentions : tuple of str
    adam : AdamConfig
    **setup
        More of ``model.train.copy_setup`` (e.g. ``d_model=16``).

    Returns
    -------
    rows : list of dict
        One per attention and step: name (the attention), step, train_loss (the loss of
        that step's training batch, before its update), eval_loss (on the held-out batches
        after the update; None between evaluations), eval_acc and elapsed_s.

    Cost: ``steps`` forward and backward passes per attention.
    """
    train_cfg = TrainConfig(steps=steps, batch_size=batch_size, seed=seed,
                            eval_every=eval_every, checkpoint_every=steps)
    copy_task_curves(os.fspath(out_dir), attentions, train_cfg, adam, reuse=False,
                     keep_freed_memory=True, length=length, **setup)
    return [row for attention in attentions
            for row in read_log_rows(attention, os.path.join(out_dir, attention, "log.csv"))]


def read_log_rows(name, path):
    """The rows of ``copy_task_rows`` for one training log (``model.train.run``'s log.csv):
    name, step, train_loss, eval_loss, eval_acc and elapsed_s, None where not evaluated."""
    log = read_log(path)
    rows = []
    for i, step in enumerate(log["step"]):
        row = {"name": name, "step": int(step)}
        for key in ("train_loss", "eval_loss", "eval_acc", "elapsed_s"):
            row[key] = None if np.isnan(log[key][i]) else float(log[key][i])
        rows.append(row)
    return rows


SPEECH_MODELS = ("bilstm", "softmax", "lsh", "linear")
# the speech figure's settings: utterances of 10-30 phonemes (about 150 frames), 256 for
# training, 40 epochs of batches of 16, the models of model.speech.train.DEFAULT_SPEECH
SPEECH_TASK = dict(min_phonemes=10, max_phonemes=30, n_train=256, n_valid=64, n_test=100)
SPEECH_EPOCHS = 40


def speech_rows(out_dir, quick=False):
    """Train the four models of the paper's Table 3 (a Bi-LSTM, and non-causal transformer
    encoders with softmax, lsh-4 and linear attention) with CTC on the SYNTHETIC phoneme
    task for the same number of epochs, and return their curves and table: the data of
    ``figures.speech_per``. The task is random phoneme templates, not speech: the error
    rates say which model learns this task, not how they compare on WSJ.

    Returns
    -------
    rows : list of dict
        name, epoch, valid_per, epoch_s (seconds of training in that epoch).
    table : list of dict
        model, n_params, epochs, test_per, s_per_epoch (the median epoch), and two rows
        for outputs that ignore the audio (the trivial baselines).
    """
    from ..model.speech.task import SpeechTask
    from ..model.speech.train import SpeechTrainConfig, speech_curves

    if quick:
        task, epochs = SpeechTask(min_phonemes=2, max_phonemes=4, n_train=8, n_valid=4,
                                  n_test=4), 2
        sizes = dict(d_model=8, n_layers=1, n_heads=2, d_mlp=16, hidden=8, lstm_layers=1)
    else:
        task, epochs, sizes = SpeechTask(**SPEECH_TASK), SPEECH_EPOCHS, {}
    curves, table = speech_curves(os.fspath(out_dir), SPEECH_MODELS, task,
                                  SpeechTrainConfig(epochs=epochs, batch_size=16),
                                  reuse=False, keep_freed_memory=True, **sizes)
    with open(curves, newline="") as f:
        rows = [{"name": r["model"], "epoch": int(r["epoch"]),
                 "valid_per": float(r["valid_per"]), "epoch_s": float(r["epoch_s"])}
                for r in csv.DictReader(f)]
    with open(table, newline="") as f:
        table_rows = list(csv.DictReader(f))
    return rows, table_rows


# the retrieval figure's settings: one layer of width d = 16 (16 features for elu+1), P from
# d/4 to 4 d pairs, 2000 updates of 32 sequences each (model.retrieval)
RETRIEVAL = dict(d=16, pairs=(4, 8, 16, 32, 64), steps=2000)


def retrieval_rows(quick=False, attentions=None, **sizes):
    """Train one attention layer per attention and number of pairs P on associative
    retrieval (``model.retrieval``, Schlag et al. 2021, section 6.1) and return the
    held-out loss and accuracy: the rows of ``figures.retrieval_capacity``.

    ``sizes`` replaces entries of ``RETRIEVAL`` (d, pairs, steps); ``quick`` is a smoke
    test's size. Rows: name (the attention), pairs, features (the state's F = d; 0 for
    softmax, which keeps every key), eval_loss, eval_acc, train_s.
    """
    import time

    from ..model import retrieval
    sizes = {**(dict(d=8, pairs=(2, 16), steps=30) if quick else RETRIEVAL), **sizes}
    cfg = retrieval.RetrievalConfig(d=sizes["d"], steps=sizes["steps"])
    rows = []
    for attention in attentions or retrieval.ATTENTIONS:
        for pairs in sizes["pairs"]:
            start = time.perf_counter()
            _, loss, accuracy = retrieval.train(attention, retrieval.RetrievalTask(pairs), cfg)
            rows.append({"name": attention, "pairs": pairs,
                         "features": 0 if attention == "softmax" else cfg.d,
                         "eval_loss": loss, "eval_acc": accuracy,
                         "train_s": time.perf_counter() - start})
    return rows


# the benchmark's cases under the names the figures show; the peers' carry their library
BENCH_NAMES = {"softmax numpy": "softmax (NumPy)", "softmax numba": "softmax (Numba, tiled)",
               "non-causal numba": "linear (Numba)",
               "causal numpy chunked": "causal linear (NumPy, chunked)",
               "causal numba": "causal linear (Numba)", "rnn step": "RNN step (Numba)",
               "lsh-1 numba": "lsh-1 (Numba)", "lsh-4 numba": "lsh-4 (Numba)",
               "lsh-8 numba": "lsh-8 (Numba)",
               "softmax kv-cache numpy": "softmax, key/value cache",
               "recompute prefix numba": "linear, recomputing the prefix"}
PEER_NAMES = {"torch softmax": ("softmax (PyTorch SDPA)", "PyTorch"),
              "pft causal linear": ("causal linear (pytorch-fast-transformers)",
                                    "pytorch-fast-transformers")}
# Figure 1 at the figures tier's size: N = 2^9 .. 2^16 at batch = max(1, 2^14 / N), so 2^14
# tokens a call up to N = 2^14 and batch 1 from there. The paper keeps 2^16 tokens a call;
# every form's work grows linearly in the batch, so the time and memory per sample should
# not depend on it (the README gives a measurement), and each call up to N = 2^14 does a
# quarter of the work. The README gives the command that measures the paper's size.
FIGURE1 = dict(min_n=2**9, max_n=2**16, tokens=2**14)


# seconds for FIGURE1["tokens"] tokens: a curve of Figure 1 stops after its first forward +
# backward slower than 3.75 s / 2^14 a token (``timing.over_budget``; a call of batch 1 past
# N = 2^14 is allowed N / 2^14 times 3.75 s). The README's command at the paper's size gives
# 15 s for 2^16 tokens, the same time a token: where the time per token does not depend on
# the batch, a curve that time stops ends at the same N at both sizes. This lets NumPy's
# chunked linear form run the whole range on a small machine and stops the quadratic ones
# after a few doublings.
FIGURE1_BUDGET = 3.75

# rounds of the benchmark's head to head, in each instruction-set mode: each round takes
# every pair in turn, and the summary takes the median over the rounds
HEAD_TO_HEAD_ROUNDS = 3
# --repeats of both full benchmark runs (quick runs take the benchmark's own): the calls a
# timing, the best of them for each side of a head-to-head pair, and at each point of
# Figure 1's curves their median (one call where the first took over timing.SLOW); other
# timings of the benchmark count by it too (``linattn.lab.bench``)
BENCH_REPEATS = 3
# our scaling cases in the AVX2 run, at N = 4096 only. The head to head times our side of a
# pair only where it is a scaling case or in cases.ALWAYS_HEAD_TO_HEAD, so these are ours of
# every pair (the non-causal softmax is always there). "causal numba", the headline, is also
# a scaling point, so that bench.txt keeps its time and memory row at that N. The AVX2
# summary reads no other scaling case, and the figures' curves come from the native run.
AVX2_CASES = ("causal numba", "softmax numba", "lsh-1 numba", "lsh-4 numba")


# what the captions and the output say when no peer ran because none was asked for
NO_PEERS = ("none ran (add them with --peer-python PATH, or make figures PEER_PYTHON=PATH: "
            "an interpreter with torch and pytorch-fast-transformers)")


def benchmark_rows(out_dir, quick=False, peer_python=None, budget=FIGURE1_BUDGET):
    """Run ``python -m linattn.lab.bench`` once into ``out_dir`` (bench.json, bench_*.csv,
    bench.txt) on the cases of ``BENCH_NAMES``, in the shape of the paper's Figure 1 (a
    quarter of its tokens a call up to N = 2^14, batch 1 from there): 8 heads,
    D = M = 64, float32, N = 2^9 .. 2^16 with the batch scaled so that batch x N =
    ``FIGURE1["tokens"]`` (batch at least 1), each case until one forward + backward takes
    over ``budget`` seconds for that many tokens (``timing.over_budget``; quick: the
    benchmark's own quick budget); the peers of ``PEER_NAMES`` too when ``peer_python`` (an
    interpreter with torch and pytorch-fast-transformers) is given. Quick: N up to 1024 and
    2048 tokens, no peers.

    Returns
    -------
    scaling : list of dict
        name, n, batch, seconds_fwd, seconds_fwdbwd (medians per sample: the call's time
        divided by the batch), peak_bytes (of one forward + backward, per sample: for
        linattn the peak of NumPy's allocations beyond the inputs, for the peers the peak
        growth of resident memory), library ("linattn" or the peer's).
    tokens : list of dict
        name, position, seconds_per_token.
    meta : dict
        machine (CPU, cores, BLAS), dtype, budget, tokens (of the budget's work) and peers,
        for the figures' captions.
    """
    from . import bench

    args = ["--out", str(out_dir), "--widths", "64", "--cases",
            *(c for c in BENCH_NAMES if c in bench.cases.CASES), "--budget", str(budget),
            "--tokens", str(FIGURE1["tokens"]), "--min-n", str(FIGURE1["min_n"])]
    args += ["--peer-python", peer_python] if peer_python else ["--no-peers"]
    args += ["--quick"] if quick else ["--max-n", str(FIGURE1["max_n"]), "--repeats",
                                       str(BENCH_REPEATS),
                                       "--gen-positions", "4096", "--rounds",
                                       str(HEAD_TO_HEAD_ROUNDS)]
    bench.main(args)
    with open(os.path.join(out_dir, "bench.json")) as f:
        results = json.load(f)
    scaling = [_per_sample(r, *_name(r["case"])) for r in results["scaling"]
               if _name(r["case"]) is not None]
    peers = (results.get("peers") or {}).get("scaling", [])
    scaling += [_per_sample(r, *_name(r["case"])) for r in peers if _name(r["case"])]
    tokens = [{"name": BENCH_NAMES[r["case"]], "position": r["position"],
               "seconds_per_token": r["seconds_per_token"]} for r in results["generation"]]
    return scaling, tokens, {"machine": machine_caption(results["machine"]),
                             "dtype": results["config"]["dtype"],
                             "budget": results["config"]["budget"],
                             "tokens": results["config"]["tokens"],
                             "peers": (results.get("peers_note") or "none ran")
                             if peer_python else NO_PEERS}


def avx2_head_to_head(out_dir, peer_python=None, rounds=HEAD_TO_HEAD_ROUNDS):
    """The benchmark's head-to-head rounds again, every side held to the AVX2 instruction set
    (``isa``; Numba compiles its kernels once more for that target), into ``out_dir``
    (bench.json and bench.txt): the ratios as an AVX2-only CPU gives them, beside the native
    run's. Only N = 4096 (the head-to-head's), the cases of ``AVX2_CASES``, no crossover;
    the peers when ``peer_python`` is given. Returns the path of bench.json."""
    import subprocess
    import sys

    args = [sys.executable, "-m", "linattn.lab.bench", "--isa", "avx2", "--out", str(out_dir),
            "--min-n", "4096", "--max-n", "4096", "--widths", "--gen-positions", "1024",
            "--rounds", str(rounds), "--repeats", str(BENCH_REPEATS), "--cases",
            *AVX2_CASES, "--no-progress"]
    args += ["--peer-python", peer_python] if peer_python else ["--no-peers"]
    subprocess.run(args, check=True, env=isa.environment("avx2"), stdout=subprocess.DEVNULL)
    return os.path.join(out_dir, "bench.json")


# the training step's head to head in make figures: the batch of the paper's copy task only,
# few rounds (each round times both sides)
TRAIN_STEP = dict(batch=16, rounds=3, repeats=3)


def train_step_head_to_head(path, mode="native", peer_python=None, extra=(), **settings):
    """Run ``python -m linattn.lab.bench.train_step`` once in a subprocess whose every side
    holds to the instruction set ``mode`` (``isa.environment``: "native" or "avx2"), writing
    its JSON to ``path``: one training step of the copy-task model, linattn against
    pytorch-fast-transformers when ``peer_python`` is given. ``settings`` replace entries
    of ``TRAIN_STEP`` (batch, rounds, repeats); ``extra`` are more of its arguments (model
    sizes). The JSON records our instruction set (``machine["instruction_set"]``) and the
    peer's (``peer_cpu_capability``). Returns ``path``."""
    import subprocess
    import sys

    settings = {**TRAIN_STEP, **settings}
    args = [sys.executable, "-m", "linattn.lab.bench.train_step", "--batch",
            str(settings["batch"]), "--rounds", str(settings["rounds"]), "--repeats",
            str(settings["repeats"]), "--out", str(path), *extra]
    args += ["--peer-python", peer_python] if peer_python else ["--no-peers"]
    os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
    subprocess.run(args, check=True, env=isa.environment(mode), stdout=subprocess.DEVNULL)
    return path


def avx2_generation(path, peer_python=None, rounds=3, batches=(1, 16), extra=()):
    """Generation at the paper's MNIST shape again, every side held to the AVX2 instruction
    set (``isa``): ``python -m linattn.lab.speed --rnn-only`` in a subprocess, linattn's RNN
    (and its products' floor) and, when ``peer_python`` is given, pft's RNN, at each of
    ``batches``, ``rounds`` timed images per row; its CSV (``speed_table``'s rows, the
    instruction sets in its header) goes to ``path``. ``extra`` are more of its arguments.
    Returns ``path``."""
    import subprocess
    import sys

    args = [sys.executable, "-m", "linattn.lab.speed", "--rnn-only", "--batch",
            *map(str, batches), "--rounds", str(rounds), "--csv", str(path), *extra]
    args += ["--peer-python", peer_python] if peer_python else []
    subprocess.run(args, check=True, env=isa.environment("avx2"), stdout=subprocess.DEVNULL)
    return path


def _name(case):
    """(figure name, library) of a benchmark case, None for cases the figures leave out."""
    if case in BENCH_NAMES:
        return BENCH_NAMES[case], "linattn"
    return PEER_NAMES.get(case)


def _per_sample(row, name, library):
    batch = row.get("batch") or 1

    def each(key):
        return None if row.get(key) is None else row[key] / batch
    # linattn's memory: the peak of what tracemalloc traces (exact: NumPy's arrays and the
    # kernels' own scratch, a few tiles); the peers': the peak growth of resident memory
    memory = "peak_extra_bytes" if library == "linattn" else "peak_rss_bytes"
    return {"name": name, "n": row["n"], "batch": batch, "seconds_fwd": each("forward_s"),
            "seconds_fwdbwd": each("forward_backward_s"), "peak_bytes": each(memory),
            "library": library}


def machine_caption(machine):
    """One line naming the machine of a benchmark's ``machine`` dict: CPU, cores, BLAS."""
    blas = machine.get("blas")
    if isinstance(blas, list) and blas:
        blas = " and ".join(blas_label(b) for b in blas)
    caption = (f"{machine.get('cpu')}, {machine.get('cores_available')} cores, BLAS {blas}, "
               f"numba {machine.get('numba')} on {machine.get('numba_threads')} threads")
    if machine.get("instruction_set"):    # benchmarks from before it was recorded lack it
        caption += f", {isa.label(machine['instruction_set'])}"
    return caption


def crossover_n(rows, slow, fast, key="seconds_fwdbwd"):
    """The first N at which curve ``fast`` takes less time than curve ``slow`` and stays
    below it at every larger N both were measured at, from ``benchmark_rows``' scaling rows;
    None when that never happens on the N measured."""
    a = {r["n"]: r[key] for r in rows if r["name"] == slow and r.get(key) is not None}
    b = {r["n"]: r[key] for r in rows if r["name"] == fast and r.get(key) is not None}
    common = sorted(set(a) & set(b))
    for i, n in enumerate(common):
        if all(b[m] < a[m] for m in common[i:]):
            return n
    return None
