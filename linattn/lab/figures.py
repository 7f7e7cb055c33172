"""The figures: measurement rows -> a PNG and a CSV of the raw numbers beside it.

``python -m linattn.lab.figures [--quick] [--out DIR]`` (or ``python -m linattn figures``)
regenerates ``figures/`` from fresh measurements (``linattn.lab.measure`` computes the
rows); the notebooks call the same functions on their own small measurements, so no figure
is drawn two ways. Each figure function takes a list of rows (dicts) and a path, and writes
``path.png`` and ``path.csv`` (``figure_csv``); the CSV opens with ``# key: value`` lines
naming the figure, the machine, the date and the tier (``figures``: this module's sizes;
``paper``: the same names at the paper's proportions, from ``linattn.lab.paper``), and
``read_csv`` reads it back. Row schemas (every row also has ``name``, the curve):

========================  ==========================================================
``feature_map_error``     n_features, seed, scale, kernel_error, output_error
``time_vs_n``             n, seconds_fwd, seconds_fwdbwd (either may be missing)
``memory_vs_n``           n, peak_bytes
``time_per_token``        position (>= 1, tokens in the context), seconds_per_token
``copy_task_loss``        step (>= 1), train_loss, eval_loss (either may be missing)
``speech_per``            epoch (>= 1), valid_per, epoch_s
``generation_speed``      batch, images_per_s, seconds_per_image, measured (a bar chart)
``retrieval_capacity``    pairs, features, eval_loss, eval_acc, train_s
========================  ==========================================================

Rows with equal name and x are repeats (seeds, runs): a curve shows their median, and a band
from their minimum to their maximum. A missing, NaN or non-positive value leaves its point
out. Every y axis is logarithmic; so is every x axis but ``copy_task_loss``'s. Log-log curves
print their fitted slope and its range in the legend, as in figure 1 of Katharopoulos et al.
(2020), arXiv:2006.16236: fitted over the larger half of the x values, where fixed overheads
matter least. Rows with a ``library`` other than linattn (the peers) are drawn dashed; the
legends sit below the axes, and a caption names the machine. matplotlib is imported inside
the functions (it is an extra) and draws with Agg.
"""
import math
import pathlib
import sys
import tempfile
import textwrap
import time

import numpy as np

from . import measure
# the CSV beside each PNG; read_csv and TIERS are re-exported for the notebooks and the tests
from .figure_csv import TIERS, machine, read_csv, write_csv  # noqa: F401
from .._cli_types import Parser, executable, out_dir

FEATURE_MAP_COLUMNS = ("name", "n_features", "seed", "scale", "kernel_error", "output_error")
TIME_COLUMNS = ("name", "n", "seconds_fwd", "seconds_fwdbwd")
MEMORY_COLUMNS = ("name", "n", "peak_bytes")
TOKEN_COLUMNS = ("name", "position", "seconds_per_token")
COPY_COLUMNS = ("name", "step", "train_loss", "eval_loss")
SPEECH_COLUMNS = ("name", "epoch", "valid_per", "epoch_s")
RETRIEVAL_COLUMNS = ("name", "pairs", "features", "eval_loss", "eval_acc", "train_s")
GENERATION_COLUMNS = ("name", "batch", "images_per_s", "seconds_per_image", "measured",
                      "library")

DPI = 120
MARKERS = "os^Dvp*hx"
LABELS = {"seconds_fwd": "forward", "seconds_fwdbwd": "forward + backward",
          "peak_bytes": "peak memory", "kernel_error": "kernel matrix vs exp(q.k / sqrt(D))",
          "output_error": "attention output vs softmax attention",
          "seconds_per_token": "one generation step",
          "train_loss": "training batch (before its step)",
          "eval_loss": "held-out batches", "valid_per": "validation phoneme error rate",
          "epoch_s": "training seconds per epoch", "images_per_s": "images per second",
          "seconds_per_image": "seconds per image",
          "eval_acc": "held-out answers read right"}


# ---- drawing ---------------------------------------------------------------------------------

def _value(row, key):
    """row[key] as a float, or None when missing, NaN or not positive (every y axis is
    logarithmic: a zero, such as memory below the measurement's granularity, has no place)."""
    value = row.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)) or value <= 0:
        return None
    return float(value)


def _series(rows, x, y):
    """{name: (xs, median, low, high)} of column ``y`` against column ``x``."""
    groups = {}
    for row in rows:
        value = _value(row, y)
        if value is not None:
            groups.setdefault(str(row["name"]), {}).setdefault(row[x], []).append(value)
    series = {}
    for name, by_x in groups.items():
        xs = np.array(sorted(by_x), dtype=float)
        ys = [np.array(by_x[key]) for key in sorted(by_x)]
        series[name] = (xs, *(np.array([f(a) for a in ys]) for f in (np.median, np.min, np.max)))
    return series


def slope(xs, ys):
    """The log-log slope of ys against xs, fitted over the larger half of xs (None with fewer
    than 3 xs: the larger half of 2 is 1)."""
    fit = slope_fit(xs, ys)
    return None if fit is None else fit[0]


def slope_fit(xs, ys):
    """(slope, first x, last x): the log-log fit of ys against xs over the larger half of xs,
    where the cost of the work outweighs a call's fixed overheads; None where that half holds
    fewer than 2 points (fewer than 3 xs)."""
    keep = xs >= np.median(xs)
    if keep.sum() < 2:
        return None
    fitted = float(np.polyfit(np.log(xs[keep]), np.log(ys[keep]), 1)[0])
    return fitted, float(xs[keep].min()), float(xs[keep].max())


def growth(xs, ys):
    """The exponent s of ys = c + a xs^s from the three largest xs, which must be evenly
    spaced on a log axis (to 0.1%): log((y3 - y2) / (y2 - y1)) / log(x3 / x2). The constant
    c (a kernel's scratch, which does not grow with N while the number of threads holding
    some is fixed) cancels in the differences, where it flattens a log-log slope at small
    xs. Exact for an exact c + a xs^s at exactly even spacing; other terms (N's beside N^2's)
    and rounded sizes move it a little (s of N^2 + N comes out just under 2)."""
    xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    order = np.argsort(xs)[-3:]
    if len(order) < 3:
        raise ValueError(f"growth needs three xs, got {len(order)}")
    (x1, x2, x3), (y1, y2, y3) = xs[order], ys[order]
    if not np.isclose(x3 / x2, x2 / x1, rtol=1e-3):      # rounded sizes: 2896 for 2^11.5
        raise ValueError(f"growth needs three evenly spaced (log) xs, got {xs[order]}")
    return float(np.log((y3 - y2) / (y2 - y1)) / np.log(x3 / x2))


def fitted_slope(rows, name, key, x="n"):
    """The slope the legend prints for curve ``name`` of column ``key`` against ``x``: log-log,
    over the larger half of x (repeats at one x: their median). None with fewer than 3 xs."""
    series = _series([row for row in rows if row["name"] == name], x, key).get(str(name))
    return None if series is None else slope(series[0], series[1])


def round_slopes(rows, name, key, x="n"):
    """(median, per round): ``fitted_slope`` of curve ``name`` fitted to each round's rows on
    their own (rows carry a "round" column), and the median over the rounds. A machine that
    changes speed in the middle of one round (a shared host can, by 1.5x for tens of
    seconds) bends that round's line only, where the best time per point of all rounds can
    mix its slow small sizes with its fast large ones."""
    rounds = sorted({row["round"] for row in rows if row["name"] == name})
    per_round = [fitted_slope([row for row in rows if row["round"] == r], name, key, x)
                 for r in rounds]
    if not per_round or None in per_round:
        raise ValueError(f"round_slopes needs three sizes or more of {name!r} in every round")
    return float(np.median(per_round)), per_round


def _power(x):
    """x as 2^k when it is a power of two, else as a number."""
    k = math.log2(x)
    return f"2^{int(k)}" if k == int(k) else f"{x:g}"


def _check_rows(rows, x, columns, loglog):
    if not rows:
        raise ValueError("no rows to draw")
    for key in ("name", x):
        missing = [row for row in rows if key not in row]
        if missing:
            raise ValueError(f"every row needs {key!r} (schema {columns}); got {missing[0]}")
    if loglog and any(float(row[x]) <= 0 for row in rows):
        raise ValueError(f"{x} must be positive on a log axis, got {min(r[x] for r in rows)}")


def _draw(ax, series, names, loglog, scale=1.0, dashed=()):
    """One curve per name: median with markers (on about 16 of its points at most), a
    min-max band, and on log-log axes the slope and its fit range in the legend, which sits
    below the axes so that it never covers a curve. ``names`` (all the figure's names, in
    order) fixes each name's colour and marker; the names in ``dashed`` (the peers) are
    drawn dashed."""
    for name, (xs, med, low, high) in sorted(series.items()):
        i = names.index(name)
        fit = slope_fit(xs, med) if loglog else None
        label = name
        if fit is not None:
            label += (f" (slope {round(fit[0], 2) + 0.0:.2f} over {_power(fit[1])}-"
                      f"{_power(fit[2])})")
        ax.plot(xs, med * scale, marker=MARKERS[i % len(MARKERS)], color=f"C{i % 10}",
                markevery=max(1, len(xs) // 16), label=label,
                linestyle="--" if name in dashed else "-")
        if np.any(high > low):
            ax.fill_between(xs, low * scale, high * scale, color=f"C{i % 10}", alpha=0.2)
    if loglog:
        ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)


def _figure(rows, path, x, columns, schema, xlabel, ylabel, title, scale=1.0, loglog=True,
            caption=None, tier="figures"):
    """Draw one panel per column that has data (log-log, or log y over linear x if not
    ``loglog``), rows whose ``library`` is not linattn dashed, ``caption`` (the machine) under
    the panels; write path.png and path.csv."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    _check_rows(rows, x, schema, loglog)
    panels = [(c, _series(rows, x, c)) for c in columns]
    panels = [(c, s) for c, s in panels if s]
    if not panels:
        raise ValueError(f"no values in columns {columns}")
    names = sorted({name for _, series in panels for name in series})
    dashed = {str(r["name"]) for r in rows if r.get("library") not in (None, "", "linattn")}
    fig = Figure(figsize=(5.6 * len(panels), 4.2 + 0.17 * len(names)), dpi=DPI,
                 layout="constrained")
    FigureCanvasAgg(fig)
    for ax, (column, series) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        _draw(ax, series, names, loglog, scale, dashed)
        ax.set(xlabel=xlabel, ylabel=ylabel, title=LABELS.get(column, column))
    if title and len(panels) == 1:
        ax.set_title(title)                 # one panel: the title replaces the column's name
    elif title:
        fig.suptitle(title)
    return _save(fig, rows, path, schema, caption, tier)


def _save(fig, rows, path, schema, caption, tier="figures", header=None):
    """Put ``caption`` (the machine) under the panels, wrapped to the figure's width, and
    write path.png and path.csv (the rows, the caption, ``tier`` and the ``header`` dict's
    items in its header)."""
    if caption:                           # wrapped to the figure's width, about 17 chars an inch
        width = int(17 * fig.get_figwidth())
        fig.supxlabel("\n".join(textwrap.fill(line, width) for line in caption.split("\n")),
                      fontsize=7, color="0.3")
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    png, table = path.with_suffix(".png"), path.with_suffix(".csv")
    fig.savefig(png)
    meta = {"figure": path.stem, **machine()}
    if caption:
        meta["caption"] = caption
    write_csv(table, rows, schema, {**meta, **(header or {})}, tier)
    return png, table


def time_vs_n(rows, path, title=None, caption=None, ylabel="seconds per call",
              tier="figures"):
    """Time against sequence length N, log-log: one panel for the forward pass and one for
    forward + backward (when the rows have it). Rows: TIME_COLUMNS (and ``library``: rows of
    another library than linattn are drawn dashed). ``caption`` names the machine.

    Returns the paths of the PNG and CSV written.
    """
    return _figure(rows, path, "n", ("seconds_fwd", "seconds_fwdbwd"), TIME_COLUMNS,
                   "sequence length N", ylabel, title, caption=caption, tier=tier)


def memory_vs_n(rows, path, title=None, caption=None, ylabel="peak memory (MiB)",
                tier="figures"):
    """Peak memory against sequence length N, log-log, in MiB. Rows: MEMORY_COLUMNS (and
    ``library``, as for ``time_vs_n``)."""
    return _figure(rows, path, "n", ("peak_bytes",), MEMORY_COLUMNS, "sequence length N",
                   ylabel, title, scale=2.0 ** -20, caption=caption, tier=tier)


def time_per_token(rows, path, title=None, caption=None, ylabel="seconds per token",
                   tier="figures"):
    """Seconds to generate one token against its position (the context length, from 1),
    log-log: an RNN state costs the same at every position, a key/value cache grows.
    Rows: TOKEN_COLUMNS; ``ylabel`` says which seconds they are (wall clock, CPU)."""
    return _figure(rows, path, "position", ("seconds_per_token",), TOKEN_COLUMNS,
                   "position (tokens in the context)", ylabel, title, caption=caption,
                   tier=tier)


def feature_map_error(rows, path, title=None, caption=None, tier="figures"):
    """Relative error of feature maps against softmax, against the number of features F:
    of the kernel matrix phi(Q) phi(K)^T versus exp(Q K^T / sqrt(D)) (Eq. 4), and of the
    attention output versus softmax attention (Eq. 2). Rows: FEATURE_MAP_COLUMNS; repeats
    over seeds give the band."""
    return _figure(rows, path, "n_features", ("kernel_error", "output_error"),
                   FEATURE_MAP_COLUMNS, "number of features F", "relative error", title,
                   caption=caption, tier=tier)


def copy_task_loss(rows, path, title=None, caption=None, tier="figures"):
    """Cross-entropy against training step on the copy task, log y over linear x, as in
    figure 2 of the paper: one panel for the training batches' loss (``train_loss``, the
    loss of step s's batch before its update) and one for the held-out loss (``eval_loss``,
    after s updates; rows without it are left out of that panel). Rows: COPY_COLUMNS, from
    ``linattn.lab.measure.copy_task_rows``."""
    return _figure(rows, path, "step", ("train_loss", "eval_loss"), COPY_COLUMNS,
                   "training step", "cross-entropy (nats per copied symbol)", title,
                   loglog=False, caption=caption, tier=tier)


def speech_per(rows, path, title=None, caption=None, tier="figures"):
    """Validation phoneme error rate against epoch, log y over linear x, one line per model,
    and the seconds each epoch took (the speech experiment, table 3 of the paper, on the
    SYNTHETIC task of ``linattn.model.speech.task``). Rows: SPEECH_COLUMNS, from
    ``linattn.lab.measure.speech_rows``."""
    return _figure(rows, path, "epoch", ("valid_per", "epoch_s"), SPEECH_COLUMNS, "epoch",
                   "", title, loglog=False, caption=caption, tier=tier)


def generation_speed(rows, path, title=None, caption=None, tier="figures", header=None):
    """Images per second and seconds per image of each generation form, one group of bars
    per batch size, log y: the measured form of Tables 1, 4 and 5 of the paper. Rows:
    GENERATION_COLUMNS, from ``linattn.lab.speed.speed_table``; rows whose ``library`` is
    not linattn (the peers) are hatched ``//`` with a dashed edge, and estimated rows
    (``measured`` false) are pale and marked "est." over their bar. ``header``: more
    ``key: value`` lines for the CSV (the instruction sets each side ran with)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    _check_rows(rows, "batch", GENERATION_COLUMNS, loglog=False)
    names = list(dict.fromkeys(str(row["name"]) for row in rows))
    batches = sorted({int(row["batch"]) for row in rows})
    width = 0.8 / len(names)
    fig = Figure(figsize=(11.2, 4.6 + 0.17 * len(names)), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    for ax, key in zip(fig.subplots(1, 2), ("images_per_s", "seconds_per_image")):
        for i, name in enumerate(names):
            label = name                                      # on the curve's first bar only
            for row in (r for r in rows if str(r["name"]) == name):
                value = _value(row, key)
                if value is None:
                    continue
                estimated = row.get("measured") in (False, "False", 0)
                peer = row.get("library") not in (None, "", "linattn")
                x = batches.index(int(row["batch"])) + (i - (len(names) - 1) / 2) * width
                ax.bar(x, value, width, color=f"C{i % 10}", alpha=0.45 if estimated else 0.9,
                       hatch="//" if peer else None, edgecolor="0.2",
                       linestyle="--" if peer else "-", label=label)
                label = None
                ax.annotate(f"{value:.3g}" + (" est." if estimated else ""), (x, value),
                            ha="center", va="bottom", fontsize=6, rotation=90,
                            xytext=(0, 2), textcoords="offset points")
        ax.set_yscale("log")
        ax.margins(y=0.25)
        ax.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
        ax.set(ylabel=LABELS[key], title=LABELS[key])
        ax.grid(True, axis="y", which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), frameon=False)
    if title:
        fig.suptitle(title)
    return _save(fig, rows, path, GENERATION_COLUMNS, caption, tier, header)


def retrieval_capacity(rows, path, title=None, caption=None, tier="figures"):
    """Associative retrieval against the number of pairs P stored, log2 x: held-out
    accuracy (linear y, from 0 to 1) and loss (log y), one line per attention, a vertical
    line where P equals the state's features F. Rows: RETRIEVAL_COLUMNS, from
    ``linattn.lab.measure.retrieval_rows``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    _check_rows(rows, "pairs", RETRIEVAL_COLUMNS, loglog=True)
    names = list(dict.fromkeys(str(r["name"]) for r in rows))
    fig = Figure(figsize=(10, 4.2), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    for ax, key in zip(fig.subplots(1, 2), ("eval_acc", "eval_loss")):
        for i, name in enumerate(names):
            own = sorted((r for r in rows if r["name"] == name), key=lambda r: r["pairs"])
            ax.plot([r["pairs"] for r in own], [r[key] for r in own], color=f"C{i}",
                    marker=MARKERS[i % len(MARKERS)], label=name)
        for f in sorted({r["features"] for r in rows if r["features"]}):
            ax.axvline(f, color="0.6", lw=0.8, ls=":", label=f"P = F = {f}")
        ax.set_xscale("log", base=2)
        if key == "eval_loss":
            ax.set_yscale("log")
        else:
            ax.set_ylim(0, 1.02)
        ax.set(xlabel="pairs stored P", title=LABELS[key],
               ylabel="accuracy" if key == "eval_acc" else "cross-entropy (nats per answer)")
        ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(-0.1, -0.16), ncol=5,
              frameon=False)
    if title:
        fig.suptitle(title)
    return _save(fig, rows, path, RETRIEVAL_COLUMNS, caption, tier)


# ---- the figures of ``python -m linattn.lab.figures`` -----------------------------------------

def _feature_maps(out, quick, caption, peer_python):
    if quick:
        rows = measure.feature_map_error_rows(n_features=(4, 16, 64, 256), seeds=range(3))
    else:
        rows = measure.feature_map_error_rows()
    return feature_map_error(rows, out / "feature_map_error", caption=caption,
                             title="Feature maps against softmax: N = 128, D = 16, "
                                   "q, k ~ 0.5 N(0, 1), float64")


# the paper's four (Figure 2), then the variants beyond the paper (model.variants)
COPY_ATTENTIONS = ("linear", "softmax", "lsh-1", "lsh-4", "decay", "gated", "delta")


def _copy_task(out, quick, caption, peer_python):
    """The four attentions of the paper's Figure 2 and the three variants beyond it (a
    learned decay, GLA's gates, the delta rule) trained afresh (the runs go to a temporary
    folder), on one thread: at these sizes a second one only adds overhead. LSH takes chunks
    of 8 positions, so that the 25 positions of a string of 12 fall into 4 chunks, as 128
    positions, the paper's longest, would fall into chunks of 32."""
    from threadpoolctl import threadpool_limits

    tiny = dict(steps=20, eval_every=5, length=3, d_model=16, n_heads=2, d_mlp=32,
                lsh_chunk_size=2)
    with tempfile.TemporaryDirectory() as runs, threadpool_limits(1):
        rows = measure.copy_task_rows(runs, attentions=COPY_ATTENTIONS,
                                      **(tiny if quick else dict(lsh_chunk_size=8)))
    title = ("Copy task" if quick else
             "Copy task: strings of 1-12 symbols, 2 layers x 4 heads x 16, float32")
    return copy_task_loss(rows, out / "copy_task_loss", title=title, caption=caption)


def _avx2_mode(out, patterns):
    """Whether to measure again in AVX2 mode, into out/data/avx2: where the mode adds a
    measurement, on a CPU with AVX-512 (``isa.avx2_mode_adds``). Elsewhere, no: the files of
    out/data/avx2 matching ``patterns`` (an earlier run's, perhaps another machine's) are
    removed instead, and the folder too once empty."""
    from . import isa
    if isa.avx2_mode_adds():
        return True
    folder = out / "data" / "avx2"
    for pattern in patterns:
        for path in folder.glob(pattern):
            path.unlink()
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
    return False


def _benchmark(out, quick, caption, peer_python):
    """One benchmark run (its files go to out/data) drawn three ways, as the paper's
    Figure 1: time and memory per sample against N at batch = max(1, T / N), T =
    ``measure.FIGURE1["tokens"]``. Not
    quick: one training step against pft (data/train_step.json) and, on a CPU with AVX-512,
    both again in AVX2 mode (data/avx2/: the head to head, train_step.json; ``_avx2_mode``:
    on a CPU whose widest vectors are AVX2's the native run is the AVX2 run)."""
    scaling, tokens, meta = measure.benchmark_rows(out / "data", quick, peer_python)
    if not quick:
        modes = [("native", out / "data")]
        if _avx2_mode(out, ("bench*", "train_step.json")):
            measure.avx2_head_to_head(out / "data" / "avx2", peer_python)
            modes.append(("avx2", out / "data" / "avx2"))
        for mode, folder in modes:
            measure.train_step_head_to_head(folder / "train_step.json", mode, peer_python)
    caption = (f"measured on {meta['machine']}; peers: {meta['peers']}\neach curve stops "
               f"after the first N at which one forward + backward call took over "
               f"{meta['budget']:g} s for {meta['tokens']} tokens' work (NumPy's softmax "
               f"also where its N x N matrices would not fit in memory)")
    size = (f"8 heads, D = M = 64, {meta['dtype']}, batch = max(1, "
            f"{measure.FIGURE1['tokens']} / N)")
    if quick:
        size = f"8 heads, D = M = 64, {meta['dtype']}"
    memory_caption = (caption + "\nlinattn: the peak of traced allocations beyond the "
                      "inputs (tracemalloc); peers: the peak growth of resident memory")
    paths = (*time_vs_n(scaling, out / "time_vs_n", title=f"Time per sample ({size})",
                        caption=caption, ylabel="seconds per sample"),
             *memory_vs_n(scaling, out / "memory_vs_n",
                          title=f"Peak memory per sample, forward + backward\n({size})",
                          caption=memory_caption, ylabel="MiB per sample"),
             *time_per_token(tokens, out / "time_per_token", caption=caption,
                             title=f"Generating one token: 8 heads, D = M = 64, "
                                   f"{meta['dtype']}"))
    for slow in ("softmax (Numba, tiled)", "softmax (PyTorch SDPA)"):
        if not any(r["name"] == slow for r in scaling):
            continue                      # a peer that did not run: nothing to compare
        n = measure.crossover_n(scaling, slow, "causal linear (Numba)")
        print(f"\n  causal linear (Numba) faster than {slow}, fwd + bwd per sample: "
              f"{'from N = ' + str(n) if n else 'not on the N measured'}", end="")
    return paths


def _speech(out, quick, caption, peer_python):
    """The four models of the paper's Table 3 on the SYNTHETIC phoneme task (runs in a
    temporary folder); the table beside the figure as speech_table.csv."""
    from threadpoolctl import threadpool_info

    from .. import dispatch
    with tempfile.TemporaryDirectory() as runs:
        rows, table = measure.speech_rows(runs, quick)
    # what the transformers' attention ran on: a padded batch, non-causal, one call per layer
    _, backend = dispatch.kernel("softmax", "auto", "auto", np, needs=dispatch.needed(
        causal=False, key_mask=True))
    blas = ", ".join(f"{i.get('internal_api')} {i.get('num_threads')}"
                     for i in threadpool_info() if i.get("user_api") == "blas")
    write_csv(out / "speech_table.csv", table, tuple(table[0]),
              {"figure": "speech_table", **machine(), "caption": caption,
               "attention": f"backend 'auto' ran {backend}", "blas threads": blas})
    title = ("Speech, SYNTHETIC phoneme task (not WSJ): CTC, "
             f"{measure.SPEECH_TASK['n_train']} training utterances, float32")
    return (*speech_per(rows, out / "speech_per", title=title if not quick else "Speech",
                        caption=caption), out / "speech_table.csv")


def _retrieval(out, quick, caption, peer_python):
    """``measure.retrieval_rows`` at the figure's sizes, BLAS on one thread (its products
    are too small to share)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        rows = measure.retrieval_rows(quick)
    d = rows[-1]["features"]
    title = ("Associative retrieval: one attention layer of width d = "
             f"{d} recalls the value of one of P stored keys, float64")
    return retrieval_capacity(rows, out / "retrieval_capacity", title=title, caption=caption)


def _generation(out, quick, caption, peer_python):
    """Generating images at the paper's MNIST shape (``lab.speed.speed_table``): each form
    at batch 1 and 16, pft's RNN too when ``peer_python`` is given; not quick, on a CPU with
    AVX-512, the two RNNs again in AVX2 mode (data/avx2/generation_speed.csv; ``_avx2_mode``).
    Quick: a tiny model, N = 16, no peers."""
    from . import speed
    if quick:
        rows, meta = speed.speed_table(batches=(1, 2), rounds=1, n=16, shape=dict(
            vocab_size=8, d_model=16, n_layers=2, n_heads=2, d_mlp=32))
    else:
        rows, meta = speed.speed_table(batches=(1, 16), rounds=3, peer_python=peer_python)
        # the RNNs again as an AVX2-only CPU runs them (the softmax forms take too long)
        if _avx2_mode(out, ("generation_speed.csv",)):
            measure.avx2_generation(out / "data" / "avx2" / "generation_speed.csv",
                                    peer_python)
    return generation_figure(rows, meta, out)


def generation_figure(rows, meta, out):
    """``generation_speed`` of ``speed_table``'s rows, captioned with its ``meta``."""
    caption = (f"measured on {meta['machine']}; {meta['threads']}; peers: {meta['peers']}\n"
               f"medians over {meta['rounds']} rounds; pale bars marked est.: estimated from "
               f"single tokens timed at a few prefix lengths")
    header = {key: meta.get(key) for key in ("instruction_set", "peer_cpu_capability")}
    return generation_speed(rows, pathlib.Path(out) / "generation_speed", caption=caption,
                            title=f"Generating images: {meta['model']}, {meta['dtype']}",
                            header=header)


# The figures ``main`` regenerates: (name, function(out_dir, quick, caption, peer_python)).
FIGURES = [("time_vs_n, memory_vs_n, time_per_token", _benchmark),
           ("feature_map_error", _feature_maps), ("copy_task_loss", _copy_task),
           ("speech_per, speech_table", _speech), ("retrieval_capacity", _retrieval),
           ("generation_speed", _generation)]


def main(argv=None):
    """``python -m linattn.lab.figures [--quick] [--out DIR] [--peer-python PY] [--only
    FIGURE ...]``: regenerate every figure, or the steps that draw those named."""
    parser = Parser(
        prog="python -m linattn figures",
        description="Measure afresh and write each figure as a PNG with a CSV beside it.")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--out", type=lambda text: pathlib.Path(out_dir(text)),
                        default=pathlib.Path("figures"),
                        help="output folder (default: figures)")
    parser.add_argument("--peer-python", type=executable, default=None,
                        help="an interpreter with torch and pytorch-fast-transformers: the "
                             "time and memory figures then draw them as dashed lines")
    parser.add_argument("--only", nargs="+", metavar="FIGURE", default=None,
                        choices=[f for name, _ in FIGURES for f in name.split(", ")],
                        help="only the steps that write these (the names in "
                             "linattn.lab.figures.FIGURES; the first step also writes the "
                             "benchmark's data files); the page is still written from all "
                             "the files in the folder")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)     # before the first step, not after its hours
    from .bench.timing import machine as bench_machine
    caption = f"computed on {measure.machine_caption(bench_machine())}"
    steps = [(name, make) for name, make in FIGURES
             if args.only is None or set(name.split(", ")) & set(args.only)]
    for i, (name, make) in enumerate(steps, 1):
        print(f"[{i}/{len(steps)}] {name} ...", end="", flush=True)
        start = time.perf_counter()
        paths = make(args.out, args.quick, caption, args.peer_python)
        print(f" {time.perf_counter() - start:.1f} s -> {', '.join(map(str, paths))}")
    from .performance_page import page_path, write_page      # the dated page of these files
    print(f"performance page -> {write_page(args.out, page_path(args.out))}")
    return 0


if __name__ == "__main__":
    from linattn import threads
    threads.relaunch_configured()       # OpenBLAS reads its thread timeout when it loads
    sys.exit(main())
