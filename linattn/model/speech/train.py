"""Training for the speech experiment, section 4.3 and Table 3 of Katharopoulos et al. (2020),
arXiv:2006.16236, on the SYNTHETIC stand-in for WSJ of ``speech.task`` (not speech: its
error rates are not comparable with the paper's).

An epoch is one pass over the training split in length-sorted batches (``epoch_batches``);
after each, the validation split is decoded greedily and scored by phoneme error rate (PER).
Deterministic given the seed, and resumable at any step like ``train.run``: batch s is a
function of (seed, s), so training, saving, loading and training on gives the parameters of
an unbroken run. ``speech_curves`` trains several models for the same number of epochs and
writes the curves (model, epoch, validation PER, seconds) and a table in the form of the
paper's Table 3 (test PER, seconds per epoch).

Paper, Table 3 (WSJ, PER % / s per epoch): Bi-LSTM 10.94 / 1047, softmax 5.12 / 2711,
LSH-4 9.33 / 2250, linear 8.08 / 824, on a GPU. The paper's models are larger than our
defaults (its Bi-LSTM: 3 layers of 320 units; ours: 2 of 64).
"""
import csv
import os
import sys
import time
from typing import NamedTuple

import numpy as np
from tqdm import tqdm

from ... import threads
from ..checkpoint import load_checkpoint, save_checkpoint
from .ctc import phoneme_error_rate
from ..optim import AdamConfig
from ..paths import adam_update
from .models import SpeechConfig, check_speech_config, decode, init_params, loss_and_grads
from .task import SpeechTask, epoch_batches, pad_batch, trivial_per
from ..train import open_log, start_or_resume

# ours: 2-layer models, small enough to train in minutes on two cores with NumPy
DEFAULT_SPEECH = dict(d_model=64, n_layers=2, n_heads=4, d_mlp=256, hidden=64, lstm_layers=2)
DEFAULT_SPEECH_ADAM = AdamConfig(lr=1e-3)
LOG_FIELDS = ("step", "epoch", "elapsed_s", "epoch_s", "train_loss", "valid_per")
TABLE_FIELDS = ("model", "n_params", "epochs", "test_per", "s_per_epoch")


class SpeechTrainConfig(NamedTuple):
    """epochs: passes over the training split; batch_size: utterances per update; seed: of
    parameters and batch order; checkpoint_every: steps between checkpoints (and one at the
    end of every epoch); fresh: each epoch trains on ``task.n_train`` utterances never seen
    before (epoch e: training utterances e n_train .. (e + 1) n_train - 1, generated as the
    epoch starts), so a model cannot overfit; epoch 0 is the fixed training split."""

    epochs: int = 10
    batch_size: int = 16
    seed: int = 0
    checkpoint_every: int = 100
    fresh: bool = False


def speech_setup(model, task=SpeechTask(), **overrides):
    """The SpeechConfig of ``model`` on ``task`` with our default sizes; ``overrides`` replace
    entries of ``DEFAULT_SPEECH`` or set other SpeechConfig fields. ValueError for an invalid
    config."""
    return check_speech_config(SpeechConfig(model=model, n_features=task.n_features,
                                            n_classes=task.n_classes,
                                            **{**DEFAULT_SPEECH, **overrides}))


def evaluate_per(params, cfg, utterances, batch_size=16):
    """Greedy-decoding PER of ``cfg`` over a list of ``Utterance``, in length-sorted batches."""
    order = np.argsort([len(u.features) for u in utterances], kind="stable")
    hyps, refs = [], []
    for i in range(0, len(order), batch_size):
        batch = pad_batch([utterances[j] for j in order[i:i + batch_size]])
        hyps += decode(params, cfg, batch)
        refs += [u.labels.tolist() for u in (utterances[j] for j in order[i:i + batch_size])]
    return phoneme_error_rate(hyps, refs)


def run_speech(cfg, task, train_cfg, adam=DEFAULT_SPEECH_ADAM, out_dir=None, resume=False,
               progress=False, echo=False, meta=None, splits=None,
               keep_freed_memory=False):
    """Train ``cfg`` on the synthetic ``task`` for ``train_cfg.epochs`` epochs in total.

    Parameters
    ----------
    cfg : SpeechConfig
    task : SpeechTask
    train_cfg : SpeechTrainConfig
    adam : AdamConfig
    out_dir : str, optional
        Where ``checkpoint.npz`` and ``log.csv`` (one row per epoch: ``LOG_FIELDS``) go.
        ``epoch_s`` is the epoch's training time (updates only, not validation); an epoch
        resumed midway logs the time and mean loss of its resumed part.
    resume : bool
        Continue from ``out_dir/checkpoint.npz``.
    progress : bool
        Draw a progress bar (loss, frames/s) on stderr.
    echo : bool
        Print a line per epoch on stderr: train loss, validation PER, seconds per epoch.
    meta : dict, optional
        JSON-able settings saved in the checkpoint.
    splits : dict, optional
        ``{"train": [...], "valid": [...]}`` lists of Utterance, to reuse across runs;
        generated from ``task`` if None.
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
    splits = splits or {name: task.split(name) for name in ("train", "valid")}
    train, valid = splits["train"], splits["valid"]
    templates = task.templates() if train_cfg.fresh else None
    n_batches = -(-len(train) // train_cfg.batch_size)
    total = train_cfg.epochs * n_batches
    log, writer, offset = (open_log(os.path.join(out_dir, "log.csv"), opt_state.step, resume,
                                     LOG_FIELDS) if out_dir else (None, None, 0.0))
    t0, frames, eval_text = time.perf_counter(), 0, ""
    bar = tqdm(total=total, initial=opt_state.step, disable=not progress, unit="step")
    try:
        while opt_state.step < total:
            epoch = opt_state.step // n_batches
            if train_cfg.fresh and epoch > 0:            # the epoch's unseen utterances
                train = [task.utterance("train", epoch * len(splits["train"]) + i, templates)
                         for i in range(len(splits["train"]))]
            counts = [len(u.features) for u in train]
            losses, train_s = [], 0.0
            for idx in epoch_batches(counts, train_cfg.batch_size, train_cfg.seed,
                                     epoch)[opt_state.step % n_batches:]:
                batch = pad_batch([train[i] for i in idx])
                t_step = time.perf_counter()
                loss, grads = loss_and_grads(params, cfg, batch)
                # the lean blocks and the compiled Adam step (``paths``' default path)
                params, opt_state, _ = adam_update(params, grads, opt_state, adam)
                train_s += time.perf_counter() - t_step
                losses.append(loss)
                frames += int(batch.input_lengths.sum())
                # mid-epoch checkpoints; an epoch's last step is saved after its log row
                if (ckpt_path and opt_state.step % train_cfg.checkpoint_every == 0
                        and opt_state.step % n_batches):
                    save_checkpoint(ckpt_path, cfg, params, opt_state, meta)
                rate = frames / max(time.perf_counter() - t0, 1e-9)
                bar.set_postfix_str(f"loss {loss:.4f} {rate:,.0f} frames/s{eval_text}",
                                    refresh=False)
                bar.update()
            per = evaluate_per(params, cfg, valid, train_cfg.batch_size)
            elapsed = offset + time.perf_counter() - t0
            eval_text = f" | valid PER {per:.3f}"
            if log:
                writer.writerow([opt_state.step, epoch + 1, f"{elapsed:.3f}", f"{train_s:.3f}",
                                 f"{np.mean(losses):.6f}", f"{per:.6f}"])
                log.flush()
            if ckpt_path:
                save_checkpoint(ckpt_path, cfg, params, opt_state, meta)
            if echo:
                bar.write(f"epoch {epoch + 1}/{train_cfg.epochs}: train loss "
                          f"{np.mean(losses):.4f} nats/phoneme, valid PER {per:.4f}, "
                          f"{train_s:.1f} s/epoch", file=sys.stderr)
    finally:
        if log:
            log.close()
        bar.close()
    return params, opt_state


def _finished(run_dir, epochs):
    log_path = os.path.join(run_dir, "log.csv")
    return (os.path.exists(log_path) and os.path.exists(os.path.join(run_dir, "checkpoint.npz"))
            and read_speech_log(log_path)["epoch"][-1:].tolist() == [epochs])


def read_speech_log(path):
    """A log written by ``run_speech`` as a dict of float arrays keyed by ``LOG_FIELDS``."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return {k: np.array([float(r[k]) for r in rows]) for k in LOG_FIELDS}


def speech_curves(out_dir=os.path.join("runs", "speech"), models=("bilstm", "softmax", "linear"),
                  task=SpeechTask(), train_cfg=SpeechTrainConfig(), adam=DEFAULT_SPEECH_ADAM,
                  reuse=True, progress=False, echo=False, keep_freed_memory=False, **sizes):
    """Train each model for the same epochs on the SYNTHETIC task; write its curves and a
    Table-3-style table.

    Parameters
    ----------
    out_dir : str
        Runs go to ``out_dir/MODEL``; the curves to ``out_dir/speech_curves.csv`` (model plus
        ``LOG_FIELDS``, one row per epoch) and the table to ``out_dir/speech_table.csv``
        (``TABLE_FIELDS``: test PER after the last epoch, the median of the epochs' training
        seconds, robust to a busy machine slowing some epochs),
        closed by two rows for outputs that ignore the audio (``trivial_per``).
    models : tuple of str
        From "bilstm", "softmax", "linear" and "lsh" (lsh-4 by default, as in the paper).
    task : SpeechTask
    train_cfg : SpeechTrainConfig
    adam : AdamConfig
    reuse : bool
        Keep a run whose log already reaches ``train_cfg.epochs`` instead of retraining.
    progress, echo, keep_freed_memory : bool
        Passed to ``run_speech``.
    **sizes
        Passed to ``speech_setup`` (``d_model``, ``hidden``, ...).

    Returns
    -------
    curves_path, table_path : str
    """
    os.makedirs(out_dir, exist_ok=True)
    cfgs = {m: speech_setup(m, task, **sizes) for m in models}    # bad names fail first
    splits = {name: task.split(name) for name in ("train", "valid", "test")}
    curves_path = os.path.join(out_dir, "speech_curves.csv")
    table_path = os.path.join(out_dir, "speech_table.csv")
    table = []
    with open(curves_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(("model", *LOG_FIELDS))
        for model, cfg in cfgs.items():
            run_dir = os.path.join(out_dir, model)
            if not (reuse and _finished(run_dir, train_cfg.epochs)):
                run_speech(cfg, task, train_cfg, adam, out_dir=run_dir, progress=progress,
                           echo=echo, splits=splits, keep_freed_memory=keep_freed_memory)
            params = load_checkpoint(os.path.join(run_dir, "checkpoint.npz"), expect=cfg).params
            with open(os.path.join(run_dir, "log.csv"), newline="") as log:
                writer.writerows([model, *row] for row in list(csv.reader(log))[1:])
            epoch_s = read_speech_log(os.path.join(run_dir, "log.csv"))["epoch_s"]
            table.append((model, sum(a.size for a in params.values()), train_cfg.epochs,
                          f"{evaluate_per(params, cfg, splits['test']):.6f}",
                          f"{np.median(epoch_s):.3f}"))
    trivial = trivial_per([u.labels for u in splits["train"]],
                          [u.labels for u in splits["test"]])
    table.append(("empty output", 0, 0, f"{trivial['empty']:.6f}", ""))
    table.append((f"phoneme {trivial['phoneme']} x {trivial['repeats']}", 0, 0,
                  f"{trivial['constant']:.6f}", ""))
    with open(table_path, "w", newline="") as f:
        csv.writer(f).writerows([TABLE_FIELDS, *table])
    return curves_path, table_path
