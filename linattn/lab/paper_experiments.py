"""The experiments of the paper tier (``linattn.lab.paper``), each model one unit of work.

Katharopoulos et al. (2020), arXiv:2006.16236, at the paper's proportions:

- ``copy_units``: the copy task of section 4.1 and Figure 2, strings of up to 63 symbols
  (128 positions), softmax, linear, and Reformer (lsh-1, lsh-4) in chunks of 32 positions;
- ``image_units``: Table 1 (section 4.2.1): the four attentions trained on one image task,
  bits per dimension on held-out images and images per second generating with each
  model's fastest form (linear as an RNN, softmax with a key/value cache, LSH recomputing
  the prefix, its only form);
- ``speech_units``: Table 3 (section 4.3): the Bi-LSTM and the softmax, lsh-4 and linear
  encoders on the SYNTHETIC phoneme task, utterances around 800 frames, fresh ones each
  epoch.

A ``Unit`` trains into its own folder (``checkpoint.npz``, ``log.csv``), resuming from the
checkpoint when asked, and then computes its results, a JSON-able dict; ``*_figure`` turn
the units' results and logs into the figure and CSV of the figures tier of the same name.
"""
import csv
import math
import os
import timeit
from typing import Callable, NamedTuple

import numpy as np

from . import measure
from ..model.checkpoint import load_checkpoint
from ..model.config import ModelConfig
from ..model.optim import adam_init
from ..model.train import DEFAULT_ADAM, TrainConfig, copy_setup, evaluate, run, train_step
from ..model.transformer import init_params

# the fastest generation form of each attention (``model.generate``'s methods)
BEST_FORM = {"linear": "recurrent", "softmax": "cache", "lsh": "recompute"}


class Unit(NamedTuple):
    """One model of one experiment: ``train(run_dir, resume)`` trains it to the end (its
    ``steps`` updates), ``results(run_dir)`` measures what the tables show, and
    ``step_seconds(k)`` is the mean seconds of one update over k timed on fresh
    parameters after one untimed (which compiles), for estimates before training."""

    experiment: str
    model: str
    steps: int
    train: Callable
    results: Callable
    step_seconds: Callable


def _timed_updates(update, k):
    """Mean seconds of ``update()`` over k calls (``timeit``) after one untimed."""
    update()
    return float(np.mean(timeit.repeat(update, number=1, repeat=k)))


def _decoder_step_seconds(cfg, task, train_cfg):
    """``Unit.step_seconds`` of a decoder trained by ``model.train.run``."""
    def step_seconds(k):
        state = [init_params(cfg, train_cfg.seed)]
        state.append(adam_init(state[0]))

        def update():
            state[:2] = train_step(*state[:2], cfg, DEFAULT_ADAM, task, train_cfg)[:2]
        return _timed_updates(update, k)
    return step_seconds


def _attention(name):
    """("lsh", {"n_hashes": R}) for "lsh-R", else (name, {})."""
    if name.startswith("lsh-"):
        return "lsh", {"n_hashes": int(name[4:])}
    return name, {}


def _train_cfg(size):
    return TrainConfig(steps=size["steps"], batch_size=size["batch_size"],
                       eval_every=size["eval_every"], checkpoint_every=size["checkpoint_every"])


# ---- copy task: Figure 2 ---------------------------------------------------------------------

def copy_units(size, progress=False):
    """The copy task's units, one per attention of ``size["attentions"]``: model sizes,
    ``length`` and ``lsh_chunk_size`` from ``size`` (see ``paper.CONFIGS``)."""
    model = {k: size[k] for k in ("length", "d_model", "n_layers", "n_heads", "d_mlp",
                                  "lsh_chunk_size")}
    train_cfg = _train_cfg(size)
    units = []
    for attention in size["attentions"]:
        task, cfg = copy_setup(attention, **model)

        def train(run_dir, resume, task=task, cfg=cfg):
            run(cfg, task, train_cfg, DEFAULT_ADAM, out_dir=run_dir, resume=resume,
                progress=progress, keep_freed_memory=True)

        def results(run_dir, cfg=cfg):
            log = measure.read_log_rows("", os.path.join(run_dir, "log.csv"))
            last = [r for r in log if r["eval_loss"] is not None][-1]
            return {"eval_loss": last["eval_loss"], "eval_acc": last["eval_acc"],
                    "n_positions": cfg.max_len + 1, "train_s": log[-1]["elapsed_s"]}
        units.append(Unit("copy", attention, train_cfg.steps, train, results,
                          _decoder_step_seconds(cfg, task, train_cfg)))
    return units


def copy_figure(units, root, out, caption, size):
    """``copy_task_loss`` of the units' logs, at ``out/copy_task_loss``, tier "paper"."""
    from .figures import copy_task_loss
    rows = [row for u in units
            for row in measure.read_log_rows(u.model, os.path.join(root, u.model, "log.csv"))]
    title = (f"Copy task: strings of 1-{size['length']} symbols "
             f"({2 * size['length'] + 2} positions), {size['n_layers']} layers x "
             f"{size['n_heads']} heads, d_model {size['d_model']}, LSH in chunks of "
             f"{size['lsh_chunk_size']}, float32")
    return copy_task_loss(rows, os.path.join(out, "copy_task_loss"), title=title,
                          caption=caption, tier="paper")


# ---- images: Table 1 -------------------------------------------------------------------------

def image_units(size, progress=False):
    """Table 1's units: each attention of ``size["attentions"]`` trained on the digits at
    ``size["side"]`` x ``size["side"]`` pixels; results: bits/dim on the test split and
    images/s generating ``size["gen_batch"]`` images at once."""
    from ..model.tasks import load_digits
    from .speed import form_seconds, thread_limit

    task = load_digits(side=size["side"])
    train_cfg = _train_cfg(size)
    units = []
    for name in size["attentions"]:
        attention, lsh = _attention(name)
        cfg = ModelConfig(vocab_size=task.vocab_size, max_len=task.seq_len,
                          attention=attention, lsh_chunk_size=size["lsh_chunk_size"],
                          **lsh, **{k: size[k] for k in ("d_model", "n_layers", "n_heads",
                                                          "d_mlp")})

        def train(run_dir, resume, cfg=cfg):
            run(cfg, task, train_cfg, DEFAULT_ADAM, out_dir=run_dir, resume=resume,
                progress=progress, keep_freed_memory=True)

        def results(run_dir, cfg=cfg):
            params = load_checkpoint(os.path.join(run_dir, "checkpoint.npz"), expect=cfg).params
            loss, _ = evaluate(params, cfg, task.test_batches(train_cfg.batch_size))
            method = BEST_FORM[cfg.attention]
            with thread_limit(size["threads"]):
                seconds, measured = form_seconds(params, cfg, method, size["gen_batch"],
                                                 task.seq_len, size["gen_rounds"],
                                                 size["gen_budget_s"])
            return {"bits_per_dim": loss / math.log(2), "form": method,
                    "images_per_s": size["gen_batch"] / seconds, "measured": measured,
                    "batch": size["gen_batch"], "n_test": len(task.test),
                    "n_params": int(sum(a.size for a in params.values()))}
        units.append(Unit("images", name, train_cfg.steps, train, results,
                          _decoder_step_seconds(cfg, task, train_cfg)))
    return units


IMAGE_COLUMNS = ("name", "bits_per_dim", "images_per_s", "form", "batch", "measured",
                 "n_params", "steps")


def image_figure(results, out, caption, size):
    """Table 1 as a figure: bits/dim and images/s of each attention, two bar panels, log
    y for images/s; writes ``out/image_table.png`` and ``.csv`` (tier "paper").
    ``results``: {attention: the unit's results}."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from .figures import DPI, _save
    rows = [{"name": name, **r, "steps": size["steps"]} for name, r in results.items()]
    fig = Figure(figsize=(10, 4.4), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    names = [r["name"] for r in rows]
    for ax, key, label in zip(fig.subplots(1, 2), ("bits_per_dim", "images_per_s"),
                              ("bits per dimension, test images (lower is better)",
                               "images per second generating (higher is better)")):
        values = [r[key] for r in rows]
        bars = ax.bar(range(len(rows)), values, color=[f"C{i}" for i in range(len(rows))])
        ax.bar_label(bars, [f"{v:.3g}" for v in values], fontsize=7)
        ax.set_xticks(range(len(rows)), [f"{n}\n({r['form']})" for n, r in zip(names, rows)],
                      fontsize=8)
        ax.set_title(label, fontsize=9)
        if key == "images_per_s":
            ax.set_yscale("log")
        ax.margins(y=0.15)
    side = size["side"]
    fig.suptitle(f"Table 1 at a CPU's size: digits at {side}x{side} (N = {side * side}), "
                 f"{size['n_layers']} layers, d_model {size['d_model']}, {size['steps']} "
                 f"steps; generating {size['gen_batch']} images at once")
    return _save(fig, rows, os.path.join(out, "image_table"), IMAGE_COLUMNS, caption, "paper")


# ---- speech: Table 3 -------------------------------------------------------------------------

def speech_task(size):
    """The SpeechTask of ``size["task"]``."""
    from ..model.speech.task import SpeechTask
    return SpeechTask(**size["task"])


def speech_units(size, progress=False):
    """Table 3's units: the models of ``size["models"]`` on ``speech_task(size)``, trained
    for ``size["epochs"]`` epochs of fresh utterances; results: test PER, parameters and
    the median seconds of an epoch's updates (every model sees the same batches)."""
    from ..model.paths import adam_update
    from ..model.speech import models
    from ..model.speech.task import pad_batch
    from ..model.speech.train import (DEFAULT_SPEECH_ADAM, SpeechTrainConfig, evaluate_per,
                                      read_speech_log, run_speech, speech_setup)
    task = speech_task(size)
    train_cfg = SpeechTrainConfig(epochs=size["epochs"], batch_size=size["batch_size"],
                                  checkpoint_every=size["checkpoint_every"], fresh=True)
    n_batches = -(-task.n_train // train_cfg.batch_size)
    splits = {}

    def split(name):                            # generated once, when a unit first needs it
        if name not in splits:
            splits[name] = task.split(name)
        return splits[name]

    units = []
    for model in size["models"]:
        cfg = speech_setup(model, task, **size["sizes"])

        def train(run_dir, resume, cfg=cfg):
            run_speech(cfg, task, train_cfg, DEFAULT_SPEECH_ADAM, out_dir=run_dir,
                       resume=resume, progress=progress, keep_freed_memory=True,
                       splits={"train": split("train"), "valid": split("valid")})

        def results(run_dir, cfg=cfg):
            params = load_checkpoint(os.path.join(run_dir, "checkpoint.npz"), expect=cfg).params
            epoch_s = read_speech_log(os.path.join(run_dir, "log.csv"))["epoch_s"]
            return {"test_per": evaluate_per(params, cfg, split("test")),
                    "n_params": int(sum(a.size for a in params.values())),
                    "epochs": train_cfg.epochs, "s_per_epoch": float(np.median(epoch_s))}
        def step_seconds(k, cfg=cfg):
            # k batches of the training split spread over its lengths, as an epoch's are
            train = split("train")
            order = np.argsort([len(u.features) for u in train], kind="stable")
            last = max(len(train) - train_cfg.batch_size, 0)
            starts = np.linspace(0, last, k).astype(int)
            batches = [pad_batch([train[i] for i in order[s:s + train_cfg.batch_size]])
                       for s in (last // 2, *starts)]          # a median one first, untimed
            state = [models.init_params(cfg, train_cfg.seed)]
            state.append(adam_init(state[0]))

            def update():
                _, grads = models.loss_and_grads(state[0], cfg, batches.pop(0))
                state[:2] = adam_update(state[0], grads, state[1], DEFAULT_SPEECH_ADAM)[:2]
            return _timed_updates(update, k)
        units.append(Unit("speech", model, train_cfg.epochs * n_batches, train, results,
                          step_seconds))
    return units


def speech_figure(units, results, root, out, caption, size):
    """``speech_per`` of the units' logs and ``speech_table.csv`` (Table 3's columns and the
    trivial outputs' rows), both tier "paper"."""
    from ..model.speech.task import trivial_per
    from .figures import machine, speech_per, write_csv
    rows = []
    for u in units:
        with open(os.path.join(root, u.model, "log.csv"), newline="") as f:
            rows += [{"name": u.model, "epoch": int(r["epoch"]),
                      "valid_per": float(r["valid_per"]), "epoch_s": float(r["epoch_s"])}
                     for r in csv.DictReader(f)]
    task = speech_task(size)
    table = [{"model": m, **{k: r[k] for k in ("n_params", "epochs", "test_per",
                                                 "s_per_epoch")}} for m, r in results.items()]
    trivial = trivial_per([task.utterance("train", i).labels for i in range(task.n_train)],
                          [task.utterance("test", i).labels for i in range(task.n_test)])
    table.append({"model": "empty output", "n_params": 0, "epochs": 0,
                  "test_per": trivial["empty"], "s_per_epoch": None})
    table.append({"model": f"phoneme {trivial['phoneme']} x {trivial['repeats']}",
                  "n_params": 0, "epochs": 0, "test_per": trivial["constant"],
                  "s_per_epoch": None})
    os.makedirs(out, exist_ok=True)
    write_csv(os.path.join(out, "speech_table.csv"), table, tuple(table[0]),
              {"figure": "speech_table", **machine(), "caption": caption}, tier="paper")
    t = size["task"]
    title = (f"Speech, SYNTHETIC phoneme task (not WSJ): CTC, {t['min_phonemes']}-"
             f"{t['max_phonemes']} phonemes an utterance, {t['n_train']} fresh training "
             f"utterances an epoch, float32")
    return (*speech_per(rows, os.path.join(out, "speech_per"), title=title, caption=caption,
                        tier="paper"), os.path.join(out, "speech_table.csv"))
