"""Training: the step, held-out evaluation, and a resumable loop with checkpoints and a
CSV log of the loss curve, for the experiments of section 4 of Katharopoulos et al. (2020),
arXiv:2006.16236.

The loop is deterministic given its seed: parameters come from ``init_params(cfg, seed)``
and batch s from ``tasks.batch_rng(seed, s)``, so training k steps, saving, loading and
training j more gives the same parameters as k + j steps without a stop.
"""
import csv
import os
import time
from typing import NamedTuple

import numpy as np
from tqdm import tqdm

from .. import threads
from .checkpoint import load_checkpoint, save_checkpoint
from .config import ModelConfig
from .layers import cross_entropy
from .optim import AdamConfig, adam_init
from .paths import adam_update, loss_and_grads, resolve
from .tasks import CopyTask, batch_rng
from .transformer import init_params

# the paper's copy-task model, section 4.1: 4 layers, 8 heads of 32, up to 128 positions
PAPER_COPY = dict(length=63, d_model=256, n_layers=4, n_heads=8, d_mlp=1024)
# ours: small enough to learn in minutes on two cores, with learned positions and Adam at
# 3e-3 (the curves it gives: docs/performance.md)
DEFAULT_COPY = dict(length=16, d_model=64, n_layers=2, n_heads=4, d_mlp=256)
DEFAULT_ADAM = AdamConfig(lr=3e-3)
LOG_FIELDS = ("step", "tokens", "elapsed_s", "train_loss", "eval_loss", "eval_acc")


class TrainConfig(NamedTuple):
    """steps: total updates; batch_size: sequences per update; seed: of parameters and
    batches; eval_every, eval_batches: held-out evaluation cadence and size;
    checkpoint_every: steps between checkpoints (and one at the end); path: which path
    computes the model and its Adam step, "lean" (compiled, the default) or "reference"
    (the NumPy layers), see ``model.paths``: the same numbers up to rounding."""

    steps: int = 3000
    batch_size: int = 32
    seed: int = 0
    eval_every: int = 100
    eval_batches: int = 4
    checkpoint_every: int = 500
    path: str = "lean"


def train_step(params, opt_state, cfg, adam, task, train_cfg):
    """One update on batch ``opt_state.step``. Returns (params, opt_state, loss, grad norm)."""
    ids, targets, weights = task.batch(batch_rng(train_cfg.seed, opt_state.step),
                                       train_cfg.batch_size)
    loss, grads = loss_and_grads(params, cfg, ids, targets, weights, path=train_cfg.path)
    params, opt_state, norm = adam_update(params, grads, opt_state, adam, path=train_cfg.path)
    return params, opt_state, loss, norm


def held_out_batches(task, train_cfg):
    """The evaluation batches: the digits' test split, or ``eval_batches`` copy batches
    from the held-out stream (never used for training)."""
    if hasattr(task, "test_batches"):
        return task.test_batches(train_cfg.batch_size)
    return [task.batch(batch_rng(train_cfg.seed, i, stream=1), train_cfg.batch_size)
            for i in range(train_cfg.eval_batches)]


def evaluate(params, cfg, batches, path="lean"):
    """Teacher-forced loss (nats per counted token) and accuracy (argmax == target) over
    ``batches`` of (ids, targets, weights), weighted by the counted tokens; the logits by
    the forward of ``path`` (``model.paths``)."""
    forward = resolve(path, cfg).forward
    total_loss = total_correct = total_weight = 0.0
    for ids, targets, weights in batches:
        logits, _ = forward(params, cfg, ids)
        w = weights.sum()
        total_loss += cross_entropy(logits, targets, weights) * w
        total_correct += float(((logits.argmax(axis=-1) == targets) * weights).sum())
        total_weight += w
    return total_loss / total_weight, total_correct / total_weight


def open_log(path, step, resume, fields=LOG_FIELDS):
    """Open the CSV log (header ``fields``: step first, elapsed seconds third) for appending
    after ``step``: on resume, rows past the checkpoint's step (written before a crash) are
    dropped. Returns (file, csv writer, elapsed seconds already logged)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    rows = []
    if resume and os.path.exists(path):
        with open(path, newline="") as f:
            rows = [r for r in csv.reader(f)][1:]
        rows = [r for r in rows if int(r[0]) <= step]
    log = open(path, "w", newline="")
    writer = csv.writer(log)
    writer.writerows([fields, *rows])
    return log, writer, float(rows[-1][2]) if rows else 0.0


def start_or_resume(cfg, init, seed, out_dir, resume):
    """(checkpoint path or None, params, Adam state): fresh from ``init(cfg, seed)``, or, with
    ``resume``, from ``out_dir/checkpoint.npz`` (whose config must equal ``cfg``)."""
    ckpt_path = os.path.join(out_dir, "checkpoint.npz") if out_dir else None
    if resume and not out_dir:
        raise ValueError("resume=True needs the out_dir holding checkpoint.npz")
    if resume:
        ckpt = load_checkpoint(ckpt_path, expect=cfg)
        return ckpt_path, ckpt.params, ckpt.opt_state
    params = init(cfg, seed)
    return ckpt_path, params, adam_init(params)


def run(cfg, task, train_cfg, adam=AdamConfig(), out_dir=None, resume=False,
        progress=False, meta=None, keep_freed_memory=False):
    """Train ``cfg`` on ``task`` for ``train_cfg.steps`` updates in total.

    Parameters
    ----------
    cfg : ModelConfig
    task : CopyTask or DigitsTask
    train_cfg : TrainConfig
    adam : AdamConfig
    out_dir : str, optional
        Where ``checkpoint.npz`` and ``log.csv`` (one row per step: step, tokens,
        elapsed_s, train_loss, and eval_loss, eval_acc every ``eval_every`` steps) go.
    resume : bool
        Continue from ``out_dir/checkpoint.npz`` (its step, parameters and Adam state).
    progress : bool
        Draw a progress bar (loss, tokens/s) on stderr.
    meta : dict, optional
        JSON-able settings saved in the checkpoint (the command line stores its arguments).
    keep_freed_memory : bool
        Make glibc keep freed arrays for reuse (``linattn.threads.keep_freed_memory``), a
        setting of the whole process that saves each step's page faults; the command line
        turns it on, a library call leaves the allocator alone by default.

    Returns
    -------
    params : dict
    opt_state : AdamState
    """
    if keep_freed_memory:
        threads.keep_freed_memory()          # no page faults for each step's fresh arrays
    ckpt_path, params, opt_state = start_or_resume(cfg, init_params, train_cfg.seed,
                                                   out_dir, resume)
    log, writer, offset = (open_log(os.path.join(out_dir, "log.csv"), opt_state.step, resume)
                           if out_dir else (None, None, 0.0))
    held_out = held_out_batches(task, train_cfg)
    start, t0, eval_text = opt_state.step, time.perf_counter(), ""
    bar = tqdm(total=train_cfg.steps, initial=start, disable=not progress, unit="step")
    tokens_per_step = train_cfg.batch_size * task.seq_len
    try:
        while opt_state.step < train_cfg.steps:
            params, opt_state, loss, _ = train_step(params, opt_state, cfg, adam, task,
                                                    train_cfg)
            step, elapsed = opt_state.step, time.perf_counter() - t0
            row = [step, step * tokens_per_step, f"{offset + elapsed:.3f}", f"{loss:.6f}",
                   "", ""]
            if step % train_cfg.eval_every == 0 or step == train_cfg.steps:
                eval_loss, eval_acc = evaluate(params, cfg, held_out, train_cfg.path)
                row[4:] = f"{eval_loss:.6f}", f"{eval_acc:.6f}"
                eval_text = f" | held-out {eval_loss:.4f} acc {eval_acc:.3f}"
            if log:
                writer.writerow(row)
            if ckpt_path and (step % train_cfg.checkpoint_every == 0
                              or step == train_cfg.steps):
                save_checkpoint(ckpt_path, cfg, params, opt_state, meta)
                log.flush()
            rate = (step - start) * tokens_per_step / max(elapsed, 1e-9)
            bar.set_postfix_str(f"loss {loss:.4f} {rate:,.0f} tok/s{eval_text}", refresh=False)
            bar.update()
    finally:
        if log:
            log.close()
        bar.close()
    return params, opt_state


def read_log(path):
    """A log written by ``run`` as a dict of float arrays keyed by ``LOG_FIELDS`` (NaN where
    a row has no evaluation)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return {k: np.array([float(r[k]) if r[k] else np.nan for r in rows]) for k in LOG_FIELDS}


def copy_setup(attention="linear", paper=False, variable=True, positions="learned",
               **overrides):
    """The copy task and model config of our default experiment (or the paper's).

    ``overrides`` replace entries of ``DEFAULT_COPY`` / ``PAPER_COPY`` (``length``,
    ``d_model``, ``n_layers``, ``n_heads``, ``d_mlp``) or set other ModelConfig fields.
    ``attention`` may also be "lsh-R", the paper's name for Reformer attention of R hash
    rounds (``attention="lsh", n_hashes=R``). Returns (CopyTask, ModelConfig).
    """
    if attention.startswith("lsh-"):
        attention, overrides = "lsh", {"n_hashes": int(attention[4:]), **overrides}
    sizes = {**(PAPER_COPY if paper else DEFAULT_COPY), **overrides}
    task = CopyTask(length=sizes.pop("length"), variable=variable)
    cfg = ModelConfig(vocab_size=task.vocab_size, max_len=task.seq_len, attention=attention,
                      positions=positions, **sizes)
    return task, cfg


def copy_task_curves(out_dir=os.path.join("runs", "copy"), attentions=("linear", "softmax"),
                     train_cfg=TrainConfig(), adam=DEFAULT_ADAM, reuse=True,
                     progress=False, keep_freed_memory=False, **setup):
    """Train each attention on the copy task and write their loss curves to one CSV, the
    data of the paper's figure 2.

    Parameters
    ----------
    out_dir : str
        Each run goes to ``out_dir/ATTENTION`` (checkpoint and log); the combined curves
        to ``out_dir/copy_curves.csv``.
    attentions : tuple of str
    train_cfg : TrainConfig
    adam : AdamConfig
    reuse : bool
        Keep a run whose log already reaches ``train_cfg.steps`` instead of retraining.
    progress : bool
    keep_freed_memory : bool
        Make glibc keep freed arrays for reuse (``linattn.threads.keep_freed_memory``), a
        setting of the whole process that saves each step's page faults; the command line
        turns it on, a library call leaves the allocator alone by default.
    **setup
        Passed to ``copy_setup`` (e.g. ``paper=True``, ``length=8``).

    Returns
    -------
    path : str
        The CSV: ``attention`` plus the columns of ``LOG_FIELDS``, one row per step.
    """
    path = os.path.join(out_dir, "copy_curves.csv")
    os.makedirs(out_dir, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(("attention", *LOG_FIELDS))
        for attention in attentions:
            task, cfg = copy_setup(attention, **setup)
            run_dir = os.path.join(out_dir, attention)
            log_path = os.path.join(run_dir, "log.csv")
            if not (reuse and os.path.exists(log_path)
                    and read_log(log_path)["step"][-1:].tolist() == [train_cfg.steps]):
                run(cfg, task, train_cfg, adam, out_dir=run_dir, progress=progress,
                    keep_freed_memory=keep_freed_memory)
            with open(log_path, newline="") as log:
                writer.writerows([attention, *row] for row in list(csv.reader(log))[1:])
    return path
