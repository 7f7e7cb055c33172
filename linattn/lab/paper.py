"""The paper tier: the experiments of Katharopoulos et al. (2020), arXiv:2006.16236, at the
paper's proportions, in hours rather than the figures tier's under one hour.

``python -m linattn.lab.paper [--out figures/paper] [--config tiny|full]
[--only speech,images,copy]``
(``make paper``) trains every model of ``paper_experiments`` (the copy task at 128
positions, Table 1 on images, Table 3 on synthetic speech of about 800 frames) and writes
the same figure and CSV names as ``python -m linattn.lab.figures``, the CSVs saying
``# tier: paper``. With ``--estimate K`` it trains nothing: it times K updates of each
model and writes the hours they project to ``OUT/paper_estimate.csv``.

Each experiment x model is a unit with its own folder, ``OUT/paper_runs/EXPERIMENT/MODEL``:
training checkpoints there every so often (parameters, Adam state and step, so a resumed
run computes what an unbroken one would), and a finished unit writes ``done.json`` with its
results. A rerun skips the finished units and resumes an unfinished one from its last
checkpoint; stop it at any time. Each model draws its tqdm progress bar (with tqdm's own
estimate of the time left); before each unit a line estimates the time left for the whole
tier from the seconds per update of the finished units of each experiment.
"""
import csv
import json
import os
import pathlib
import sys
import tempfile

from . import paper_experiments as experiments
from .._cli_types import Parser, out_dir, positive_int

EXPERIMENTS = ("copy", "images", "speech")

# The sizes of each experiment: "full" for ``make paper`` (about 6-8 hours on 2 cores, see
# docs/speech.md for how the speech epochs were chosen), "tiny" for the tests (seconds).
CONFIGS = {
    "full": {
        # Figure 2: 128 positions (strings of up to 63 symbols), LSH in chunks of 32
        "copy": dict(attentions=("softmax", "linear", "lsh-1", "lsh-4"), length=63,
                     d_model=64, n_layers=2, n_heads=4, d_mlp=256, lsh_chunk_size=32,
                     steps=2000, batch_size=32, eval_every=100, checkpoint_every=100),
        # Table 1: the digits at 16x16 (256 positions), the four attentions
        "images": dict(attentions=("softmax", "lsh-1", "lsh-4", "linear"), side=16,
                       d_model=64, n_layers=4, n_heads=4, d_mlp=256, lsh_chunk_size=32,
                       steps=2000, batch_size=16, eval_every=250, checkpoint_every=100,
                       gen_batch=16, gen_rounds=3, gen_budget_s=120.0, threads=2),
        # Table 3: utterances of 80-135 phonemes (about 800 frames), fresh every epoch
        "speech": dict(models=("bilstm", "softmax", "lsh", "linear"),
                       task=dict(min_phonemes=80, max_phonemes=135, n_train=512,
                                 n_valid=64, n_test=100),
                       sizes=dict(d_model=64, n_layers=2, n_heads=4, d_mlp=256, hidden=64,
                                  lstm_layers=2),
                       epochs=24, batch_size=16, checkpoint_every=8),
    },
    "tiny": {
        "copy": dict(attentions=("softmax", "linear", "lsh-1", "lsh-4"), length=7,
                     d_model=8, n_layers=1, n_heads=2, d_mlp=16, lsh_chunk_size=4,
                     steps=6, batch_size=4, eval_every=3, checkpoint_every=2),
        "images": dict(attentions=("softmax", "lsh-1", "lsh-4", "linear"), side=4,
                       d_model=8, n_layers=1, n_heads=2, d_mlp=16, lsh_chunk_size=4,
                       steps=4, batch_size=8, eval_every=2, checkpoint_every=2,
                       gen_batch=2, gen_rounds=1, gen_budget_s=5.0, threads=1),
        "speech": dict(models=("bilstm", "softmax", "lsh", "linear"),
                       task=dict(min_phonemes=2, max_phonemes=4, n_train=8, n_valid=4,
                                 n_test=4),
                       sizes=dict(d_model=8, n_layers=1, n_heads=2, d_mlp=16, hidden=8,
                                  lstm_layers=1, lsh_chunk_size=4),
                       epochs=2, batch_size=4, checkpoint_every=1),
    },
}

UNITS = {"copy": experiments.copy_units, "images": experiments.image_units,
         "speech": experiments.speech_units}


def unit_dir(root, unit):
    """``root/paper_runs/EXPERIMENT/MODEL``: the unit's checkpoint, log and done.json."""
    return pathlib.Path(root) / "paper_runs" / unit.experiment / unit.model


def _write_json(path, value):
    """Write ``value`` to ``path`` atomically (temporary file, then rename)."""
    fd, tmp = tempfile.mkstemp(prefix=".done-", suffix=".json.tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def read_done(root, unit):
    """The ``done.json`` of a finished unit (a dict), or None if it has not finished."""
    path = unit_dir(root, unit) / "done.json"
    if not path.exists():
        return None
    with open(path) as f:
        return json.load(f)


def time_left(units, done):
    """(seconds, experiments): the seconds left for the unfinished ``units`` of each
    experiment that has a finished unit, each at the seconds per update of its experiment's
    finished units (from their ``done.json``); and the experiments with units left but none
    finished, whose speed is not measured yet."""
    seconds, unmeasured = 0.0, []
    for experiment in dict.fromkeys(u.experiment for u in units if u not in done):
        finished = [done[u] for u in units if u.experiment == experiment and u in done]
        if not finished:
            unmeasured.append(experiment)
            continue
        rate = sum(d["train_s"] for d in finished) / sum(d["steps"] for d in finished)
        seconds += rate * sum(u.steps for u in units
                              if u.experiment == experiment and u not in done)
    return seconds, unmeasured


def _hours(seconds):
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def run_units(units, root, echo=print):
    """Train every unit not finished under ``root`` (resuming one that has a checkpoint),
    write its ``done.json`` and return {unit: its done.json contents}.

    ``done.json`` holds experiment, model, steps, train_s (the seconds of training the
    log recorded, over every resumed part) and results (the unit's ``results``).
    """
    done = {u: d for u in units if (d := read_done(root, u)) is not None}
    for i, unit in enumerate(units, 1):
        if unit in done:
            continue
        left, unmeasured = time_left(units, done)
        run_dir = unit_dir(root, unit)
        resume = (run_dir / "checkpoint.npz").exists()
        estimate = f"about {_hours(left)}"
        if unmeasured:
            estimate += f" plus {', '.join(unmeasured)} (no model of it finished yet)"
        echo(f"[paper {i}/{len(units)}] {unit.experiment} / {unit.model}"
             f"{' (resumed from its checkpoint)' if resume else ''}; {len(done)} of "
             f"{len(units)} models done; time left for the tier: {estimate}")
        run_dir.mkdir(parents=True, exist_ok=True)
        unit.train(str(run_dir), resume)
        with open(run_dir / "log.csv", newline="") as f:
            elapsed = float(list(csv.DictReader(f))[-1]["elapsed_s"])
        done[unit] = {"experiment": unit.experiment, "model": unit.model,
                      "steps": unit.steps, "train_s": elapsed,
                      "results": unit.results(str(run_dir))}
        _write_json(run_dir / "done.json", done[unit])
    return done


def run_paper(out, config="full", only=EXPERIMENTS, progress=True, echo=print):
    """Run the experiments ``only`` at ``CONFIGS[config]`` into ``out`` and draw their
    figures (tier "paper"). Returns the paths written."""
    from .bench.timing import machine as bench_machine
    from .measure import machine_caption
    sizes = CONFIGS[config]
    caption = (f"computed on {machine_caption(bench_machine())}; make paper "
               f"(--config {config})")
    units = {e: UNITS[e](sizes[e], progress=progress) for e in EXPERIMENTS if e in only}
    done = run_units([u for e in units for u in units[e]], out, echo)
    paths = []
    for experiment, group in units.items():
        root = pathlib.Path(out) / "paper_runs" / experiment
        results = {u.model: done[u]["results"] for u in group}
        if experiment == "copy":
            paths += experiments.copy_figure(group, root, out, caption, sizes["copy"])
        elif experiment == "images":
            paths += experiments.image_figure(results, out, caption, sizes["images"])
        else:
            paths += experiments.speech_figure(group, results, root, out, caption,
                                               sizes["speech"])
    return paths


ESTIMATE_COLUMNS = ("experiment", "model", "steps", "s_per_step", "hours")


def estimate(units, k=3, echo=print):
    """Time ``k`` updates of every unit (``Unit.step_seconds``) and scale them to its
    ``steps``: rows of ``ESTIMATE_COLUMNS``, an estimate of training time only (evaluations,
    validation and generation come on top)."""
    rows = []
    for unit in units:
        s = unit.step_seconds(k)
        rows.append({"experiment": unit.experiment, "model": unit.model, "steps": unit.steps,
                     "s_per_step": s, "hours": s * unit.steps / 3600})
        echo(f"{unit.experiment:<8} {unit.model:<8} {unit.steps:>7} updates x {s:8.3f} s = "
             f"{rows[-1]['hours']:6.2f} h (estimated from {k} updates)")
    echo(f"all: {sum(r['hours'] for r in rows):.2f} h of training (estimated)")
    return rows


def _experiments(text):
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in EXPERIMENTS]
    if unknown or not names:
        raise ValueError(f"experiments must be from {', '.join(EXPERIMENTS)}, got {text!r}")
    return names


def main(argv=None):
    """``python -m linattn.lab.paper [--out DIR] [--config tiny|full] [--only ...]``."""
    parser = Parser(
        prog="python -m linattn.lab.paper",
        description="The paper's experiments at the paper's proportions (hours): copy task "
                    "at 128 positions, Table 1 on images, Table 3 on synthetic speech of "
                    "about 800 frames. Resumable: a rerun skips finished models and resumes "
                    "an unfinished one from its checkpoint.")
    parser.add_argument("--out", type=lambda text: pathlib.Path(out_dir(text)),
                        default=pathlib.Path("figures") / "paper",
                        help="output folder (default: figures/paper, beside the figures "
                             "tier's files, which the notebooks read); runs go to "
                             "OUT/paper_runs")
    parser.add_argument("--config", choices=tuple(CONFIGS), default="full",
                        help="sizes: full (default, hours) or tiny (seconds, for tests)")
    parser.add_argument("--only", type=_experiments, default=EXPERIMENTS,
                        help=f"comma-separated experiments (default: {','.join(EXPERIMENTS)})")
    parser.add_argument("--estimate", type=positive_int, metavar="K", default=None,
                        help="train nothing: time K updates of each model and estimate the "
                             "hours of training; writes OUT/paper_estimate.csv")
    args = parser.parse_args(argv)
    if args.estimate:
        from .figures import machine, write_csv
        from .bench.timing import machine as bench_machine
        from .measure import machine_caption
        from .. import threads
        threads.keep_freed_memory()        # as the training runs do: no page faults per step
        sizes = CONFIGS[args.config]
        units = [u for e in EXPERIMENTS if e in args.only for u in UNITS[e](sizes[e])]
        rows = estimate(units, args.estimate)
        args.out.mkdir(parents=True, exist_ok=True)
        write_csv(args.out / "paper_estimate.csv", rows, ESTIMATE_COLUMNS,
                  {"figure": "paper_estimate", **machine(), "config": args.config,
                   "caption": f"estimated on {machine_caption(bench_machine())} from "
                              f"{args.estimate} timed updates a model"}, tier="paper")
        return 0
    for path in run_paper(args.out, args.config, args.only):
        print(f"wrote {path}")
    from .performance_page import page_path, write_page      # the dated page of these files
    print(f"performance page -> {write_page(args.out, page_path(args.out))}")
    return 0


if __name__ == "__main__":
    from linattn import threads
    threads.relaunch_configured()       # OpenBLAS reads its thread timeout when it loads
    sys.exit(main())
