"""The command line of the model: ``train`` and ``generate``.

    python -m linattn train copy --attention linear          # -> runs/copy/linear/
    python -m linattn train digits --attention softmax       # -> runs/digits/softmax/
    python -m linattn train speech --model linear             # -> runs/speech/linear/
    python -m linattn generate --checkpoint runs/digits/linear/checkpoint.npz --n 16

``train`` writes ``checkpoint.npz`` and ``log.csv`` (the loss curve) to ``--out``; the
checkpoint's ``meta`` records the task, so ``generate`` knows what to write: a PNG grid of
digits (matplotlib, imported only then) or copy-task continuations with their accuracy.
``train speech`` trains a CTC model on a SYNTHETIC stand-in for WSJ (``speech.task``).

Every option is checked before any work and before anything is written (``linattn._cli_types``):
a mistake is one line on stderr naming the flag, and exit status 2.
"""
import os
import sys

import numpy as np

from .._cli_types import (Parser, new_file, non_negative_float, non_negative_int, out_dir,
                          positive_float, positive_int)
from ..feature_maps import FEATURE_MAPS
from .checkpoint import CheckpointError, load_checkpoint
from .config import ATTENTIONS, VARIANTS, ModelConfig, check_config
from .generate import METHODS, generate
from .optim import AdamConfig
from .tasks import batch_rng, load_digits
from .train import (DEFAULT_ADAM, DEFAULT_COPY, TrainConfig, copy_setup, evaluate,
                    held_out_batches, run)

COPY_ONLY = ("length", "fixed_length", "paper")   # options of the copy task alone


def _adam_options(ap, adam):
    """--lr, --warmup, --clip, with ``adam``'s values as defaults."""
    ap.add_argument("--lr", type=positive_float, default=adam.lr, help="peak learning rate")
    ap.add_argument("--warmup", type=non_negative_int, default=adam.warmup,
                    help="steps of linear learning-rate ramp")
    ap.add_argument("--clip", type=non_negative_float, default=adam.clip,
                    help="largest global gradient norm (0: no clipping)")


def _run_options(ap):
    """--out, --resume, --quiet."""
    ap.add_argument("--out", type=out_dir, help="output directory (default runs/TASK/MODEL)")
    ap.add_argument("--resume", action="store_true", help="continue from --out/checkpoint.npz")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")


def _train_parser():
    ap = Parser(prog="python -m linattn train",
                description="Train a linear or softmax transformer. (python -m linattn train "
                            "speech --help: the CTC models on synthetic phoneme data.)")
    ap.add_argument("task", choices=("copy", "digits"))
    ap.add_argument("--attention", choices=ATTENTIONS, default="linear")
    ap.add_argument("--feature-map", choices=tuple(FEATURE_MAPS), default="elu+1")
    ap.add_argument("--paper", action="store_true",
                    help="copy: the paper's model, 4 layers, 8 heads of 32, 128 positions")
    ap.add_argument("--length", type=positive_int, help="copy: longest string to copy")
    ap.add_argument("--fixed-length", action="store_true",
                    help="copy: every string has the full length")
    for name in ("d_model", "n_layers", "n_heads", "d_mlp"):
        ap.add_argument("--" + name.replace("_", "-"), type=positive_int)
    ap.add_argument("--positions", choices=("sinusoidal", "learned"), default="learned")
    ap.add_argument("--steps", type=positive_int,
                    help="updates (default: copy 3000; digits 800, past which 1500 "
                         "training images overfit)")
    ap.add_argument("--batch-size", type=positive_int, default=32)
    _adam_options(ap, DEFAULT_ADAM)
    ap.add_argument("--seed", type=non_negative_int, default=0)
    ap.add_argument("--eval-every", type=positive_int, default=100)
    ap.add_argument("--checkpoint-every", type=positive_int, default=500)
    _run_options(ap)
    ap.add_argument("--path", choices=("lean", "reference"), default="lean",
                    help="lean: compiled elementwise layers (the default); reference: the "
                         "NumPy layers, the same numbers up to rounding, slower (always "
                         f"for {', '.join(VARIANTS)})")
    return ap


def _task(args):
    """The task and model config that the (stored) training arguments describe."""
    sizes = {k: args[k] for k in DEFAULT_COPY if args.get(k) is not None}
    choices = dict(feature_map=args["feature_map"], positions=args["positions"])
    if args["task"] == "copy":
        return copy_setup(args["attention"], args["paper"], not args["fixed_length"],
                          **sizes, **choices)
    task = load_digits()
    sizes = {**DEFAULT_COPY, **sizes}
    sizes.pop("length")
    return task, ModelConfig(vocab_size=task.vocab_size, max_len=task.seq_len,
                             attention=args["attention"], **sizes, **choices)


def _check_resume(ap, out, cfg, again):
    """With --resume: refuse (one line, exit 2) a missing or unreadable ``out``/checkpoint.npz,
    or one trained with another model config, naming the fields that differ. ``again`` is
    the command that would train it."""
    path = os.path.join(out, "checkpoint.npz")
    if not os.path.isfile(path):
        ap.error(f"argument --resume: no checkpoint at {path}; train first with {again} "
                 f"(without --resume)")
    try:
        saved = load_checkpoint(path).config
    except (CheckpointError, OSError, ValueError, KeyError) as err:
        ap.error(f"argument --resume: {err}")
    if type(saved) is not type(cfg):
        ap.error(f"argument --resume: {path} holds a {type(saved).__name__}, not the "
                 f"{type(cfg).__name__} these options describe")
    differ = [f"{f} {getattr(saved, f)!r} (checkpoint) vs {getattr(cfg, f)!r} (options)"
              for f in cfg._fields if getattr(saved, f) != getattr(cfg, f)]
    if differ:
        ap.error(f"argument --resume: {path} was trained with another model: "
                 f"{'; '.join(differ)}; pass the options it was trained with, or another "
                 f"--out")


def _speech_parser():
    from .speech.models import MODELS
    from .speech.task import SpeechTask
    from .speech.train import DEFAULT_SPEECH, DEFAULT_SPEECH_ADAM, SpeechTrainConfig
    task, train_cfg = SpeechTask(), SpeechTrainConfig()
    ap = Parser(
        prog="python -m linattn train speech",
        description="Train a CTC phoneme recogniser (section 4.3, Table 3 of the paper) on "
                    "SYNTHETIC data: random phoneme templates held for random durations, "
                    "blended, with gain, offset and noise. Not speech, and not WSJ: the "
                    "error rates are not comparable with the paper's.")
    ap.add_argument("--model", choices=MODELS, default="linear",
                    help="a Bi-LSTM or a non-causal transformer encoder with this attention "
                         "(lsh: 4 hash rounds, as the paper's lsh-4)")
    ap.add_argument("--feature-map", choices=tuple(FEATURE_MAPS), default="elu+1")
    for name, value in DEFAULT_SPEECH.items():
        ap.add_argument("--" + name.replace("_", "-"), type=positive_int, default=value)
    ap.add_argument("--epochs", type=positive_int, default=train_cfg.epochs)
    ap.add_argument("--batch-size", type=positive_int, default=train_cfg.batch_size)
    _adam_options(ap, DEFAULT_SPEECH_ADAM)
    ap.add_argument("--seed", type=non_negative_int, default=0,
                    help="of the model and the batch order")
    for name in ("n_train", "n_valid", "n_test", "min_phonemes", "max_phonemes"):
        ap.add_argument("--" + name.replace("_", "-"), type=positive_int,
                        default=getattr(task, name),
                        help="synthetic data: utterances per split, or phonemes per utterance")
    ap.add_argument("--noise", type=non_negative_float, default=task.noise,
                    help="synthetic data: std of the noise on each feature")
    ap.add_argument("--data-seed", type=non_negative_int, default=task.seed,
                    help="of the synthetic data")
    ap.add_argument("--checkpoint-every", type=positive_int,
                    default=train_cfg.checkpoint_every)
    _run_options(ap)
    return ap


def speech_train_main(argv=None):
    """``python -m linattn train speech --model ...``: train on the SYNTHETIC phoneme task,
    one line per epoch (train loss, validation PER, s/epoch), then the test PER."""
    from .speech.task import SpeechTask, trivial_per
    from .speech.train import (DEFAULT_SPEECH, SpeechTrainConfig, evaluate_per, run_speech,
                               speech_setup)
    ap = _speech_parser()
    args = vars(ap.parse_args(argv))
    if args["min_phonemes"] > args["max_phonemes"]:
        ap.error(f"argument --min-phonemes: must be at most --max-phonemes "
                 f"({args['max_phonemes']}), got {args['min_phonemes']}")
    data = ("n_train", "n_valid", "n_test", "min_phonemes", "max_phonemes", "noise")
    task = SpeechTask(**{k: args[k] for k in data}, seed=args["data_seed"])
    try:
        cfg = speech_setup(args["model"], task, feature_map=args["feature_map"],
                           **{k: args[k] for k in DEFAULT_SPEECH})
    except ValueError as err:                    # sizes that do not fit together
        ap.error(f"the model options do not fit together: {err}")
    out = args["out"] or os.path.join("runs", "speech", args["model"])
    if args["resume"]:
        _check_resume(ap, out, cfg, f"python -m linattn train speech --out {out}")
    train_cfg = SpeechTrainConfig(epochs=args["epochs"], batch_size=args["batch_size"],
                                  seed=args["seed"], checkpoint_every=args["checkpoint_every"])
    adam = AdamConfig(lr=args["lr"], warmup=args["warmup"], clip=args["clip"])
    shape = (f"{cfg.lstm_layers} x {cfg.hidden} per direction" if cfg.model == "bilstm" else
             f"{cfg.n_layers} layers, {cfg.n_heads} heads of {cfg.d_model // cfg.n_heads}")
    print(f"training {cfg.model} ({shape}) with CTC on the SYNTHETIC phoneme task "
          f"({task.n_train} training utterances) -> {out}", file=sys.stderr)
    splits = {name: task.split(name) for name in ("train", "valid", "test")}
    params, _ = run_speech(cfg, task, train_cfg, adam, out_dir=out, resume=args["resume"],
                           progress=not args["quiet"], echo=True,
                           meta={"train_args": {**args, "task": "speech"}}, splits=splits,
                           keep_freed_memory=True)
    trivial = trivial_per([u.labels for u in splits["train"]], [u.labels for u in splits["test"]])
    print(f"test PER after {train_cfg.epochs} epochs: "
          f"{evaluate_per(params, cfg, splits['test'], train_cfg.batch_size):.4f} "
          f"(output ignoring the audio: empty 1.0, best constant {trivial['constant']:.4f})",
          file=sys.stderr)
    return 0


def train_main(argv=None):
    """``python -m linattn train copy|digits|speech ...``: train, checkpoint, log the loss
    curve (``speech``: see ``speech_train_main``). Every option is checked first; nothing is
    written when one is wrong."""
    if argv and argv[0] == "speech":
        return speech_train_main(argv[1:])
    ap = _train_parser()
    args = vars(ap.parse_args(argv))
    if args["task"] == "digits":
        for name in COPY_ONLY:
            if args[name]:
                ap.error(f"argument --{name.replace('_', '-')}: applies to the copy task "
                         f"only, not to digits")
    try:
        task, cfg = _task(args)
        check_config(cfg)
    except ValueError as err:                    # sizes that do not fit together
        ap.error(f"the model options do not fit together: {err}")
    out = args["out"] or os.path.join("runs", args["task"], args["attention"])
    if args["resume"]:
        _check_resume(ap, out, cfg, f"python -m linattn train {args['task']} --out {out}")
    steps = args["steps"] or (3000 if args["task"] == "copy" else 800)
    train_cfg = TrainConfig(steps=steps, batch_size=args["batch_size"],
                            seed=args["seed"], eval_every=args["eval_every"],
                            checkpoint_every=args["checkpoint_every"], path=args["path"])
    adam = AdamConfig(lr=args["lr"], warmup=args["warmup"], clip=args["clip"])
    print(f"training {cfg.attention} attention on {args['task']} "
          f"({cfg.n_layers} layers, {cfg.n_heads} heads of {cfg.d_head}, N = {task.seq_len})"
          f" -> {out}", file=sys.stderr)
    if cfg.attention in VARIANTS and args["path"] == "lean":
        print(f"{cfg.attention} attention runs on the reference path (the compiled path has "
              f"none of {', '.join(VARIANTS)})", file=sys.stderr)
    params, _ = run(cfg, task, train_cfg, adam, out_dir=out, resume=args["resume"],
                    progress=not args["quiet"], meta={"train_args": args},
                    keep_freed_memory=True)
    loss, accuracy = evaluate(params, cfg, held_out_batches(task, train_cfg), train_cfg.path)
    score = (f"{loss / np.log(2):.4f} bits/dim" if args["task"] == "digits"
             else f"loss {loss:.4f} nats/token, accuracy {accuracy:.4f}")
    print(f"held-out after {steps} steps: {score}", file=sys.stderr)
    return 0


def _digits_png(tokens, path):
    """Save generated digits (B, 64) as a grid of 8x8 grey images."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = len(tokens)
    cols = int(np.ceil(np.sqrt(n)))
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(cols, rows), dpi=100, squeeze=False)
    for ax, i in zip(axes.ravel(), range(rows * cols)):
        ax.axis("off")
        if i < n:
            ax.imshow(tokens[i].reshape(8, 8), cmap="gray_r", vmin=0, vmax=16)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


def _generate_parser():
    ap = Parser(prog="python -m linattn generate",
                description="Generate from a trained checkpoint.")
    ap.add_argument("--checkpoint", required=True, help="checkpoint.npz written by train")
    ap.add_argument("--n", type=positive_int, default=16, help="number of samples")
    ap.add_argument("--temperature", type=non_negative_float, default=1.0, help="0: greedy")
    ap.add_argument("--seed", type=non_negative_int, default=0)
    ap.add_argument("--method", choices=METHODS, default="auto")
    ap.add_argument("--out", type=new_file,
                    help="output file (default: samples.png or .txt beside the checkpoint)")
    return ap


def _load_for_generation(ap, path):
    """(checkpoint, task) of ``path``, or one line and exit 2 for a file that is missing,
    unreadable, or not a generator's."""
    if not os.path.isfile(path):
        ap.error(f"argument --checkpoint: no checkpoint at {path!r}; train first with "
                 f"python -m linattn train copy (or digits) --out DIR, then pass "
                 f"DIR/checkpoint.npz")
    try:
        ckpt = load_checkpoint(path)
    except (CheckpointError, OSError, ValueError, KeyError) as err:
        ap.error(f"argument --checkpoint: {err}")
    train_args = ckpt.meta.get("train_args")
    if not isinstance(train_args, dict):
        ap.error(f"argument --checkpoint: {path} records no training task; cannot generate")
    if train_args.get("task") == "speech":
        ap.error(f"argument --checkpoint: {path} is a speech model: it scores frames, it "
                 f"does not generate")
    try:
        task, _ = _task(train_args)
    except (KeyError, TypeError, ValueError) as err:
        ap.error(f"argument --checkpoint: {path} records unusable training options ({err})")
    return ckpt, task, train_args["task"]


def generate_main(argv=None):
    """``python -m linattn generate --checkpoint PATH --n N``: write samples."""
    ap = _generate_parser()
    args = ap.parse_args(argv)
    ckpt, task, kind = _load_for_generation(ap, args.checkpoint)
    base = os.path.join(os.path.dirname(args.checkpoint), "samples")
    if kind == "digits":
        prompt = np.full((args.n, 1), task.start)
        tokens = generate(ckpt.params, ckpt.config, prompt, task.seq_len,
                          method=args.method, temperature=args.temperature, seed=args.seed)
        out = args.out or base + ".png"
        _digits_png(tokens[:, 1:], out)
    else:
        prompt, w = task.prompts(batch_rng(args.seed, 0, stream=2), args.n)
        tokens = generate(ckpt.params, ckpt.config, prompt, task.length,
                          method=args.method, temperature=args.temperature, seed=args.seed)
        copied = tokens[:, prompt.shape[1]:]
        out = args.out or base + ".txt"
        with open(out, "w") as f:
            for row, want in zip(copied, w):
                f.write(f"{' '.join(map(str, want))} -> {' '.join(map(str, row))}\n")
        print(f"copy accuracy {np.mean(copied == w):.4f} over {args.n} strings",
              file=sys.stderr)
    print(f"wrote {args.n} samples to {out}", file=sys.stderr)
    return 0
