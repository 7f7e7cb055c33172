"""The figures: measurement rows -> a PNG and a CSV of the raw numbers beside it.

``python -m linattn.figures [--quick] [--out DIR]`` (or ``python -m linattn figures``)
regenerates ``figures/`` from fresh measurements; the notebooks call the same functions on their own small measurements, so no
figure is drawn two ways. Each figure function takes a list of rows (dicts) and a path, and
writes ``path.png`` and ``path.csv``; the CSV opens with ``# key: value`` lines naming the
figure, the machine and the date, and ``read_csv`` reads it back. Row schemas (every row also has ``name``, the curve):

========================  ==========================================================
``feature_map_error``     n_features, seed, scale, kernel_error, output_error
``time_vs_n``             n, seconds_fwd, seconds_fwdbwd (either may be missing)
``memory_vs_n``           n, peak_bytes
``time_per_token``        position (>= 1, tokens in the context), seconds_per_token
========================  ==========================================================

Rows with equal name and x are repeats (seeds, runs): a curve shows their median, and a band
from their minimum to their maximum. A missing or NaN value leaves its point out. Log-log
curves print their fitted slope in the legend, as in figure 1 of Katharopoulos et al. (2020),
arXiv:2006.16236: fitted over the larger half of the x values, where fixed overheads matter
least. matplotlib is imported inside the functions (it is an extra) and draws with Agg.
"""
import argparse
import csv
import datetime
import math
import os
import pathlib
import platform
import sys
import time

import numpy as np

from .feature_maps import Favor, Taylor
from .linear import linear_attention
from .softmax import softmax_attention

FEATURE_MAP_COLUMNS = ("name", "n_features", "seed", "scale", "kernel_error", "output_error")
TIME_COLUMNS = ("name", "n", "seconds_fwd", "seconds_fwdbwd")
MEMORY_COLUMNS = ("name", "n", "peak_bytes")
TOKEN_COLUMNS = ("name", "position", "seconds_per_token")

DPI = 120
MARKERS = "os^Dvp*hx"
LABELS = {"seconds_fwd": "forward", "seconds_fwdbwd": "forward + backward",
          "peak_bytes": "peak memory", "kernel_error": "kernel matrix vs exp(q.k / sqrt(D))",
          "output_error": "attention output vs softmax attention",
          "seconds_per_token": "one generation step"}


# ---- CSV: the raw numbers beside each PNG ---------------------------------------------------

def machine():
    """The machine and date a measurement ran on, as a dict of short strings."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.platform()}, {platform.machine()}, {os.cpu_count()} CPUs",
            "python": platform.python_version(), "numpy": np.__version__}


def write_csv(path, rows, columns, meta):
    """Write ``rows`` to ``path``: ``# key: value`` lines for ``meta``, then a CSV table.

    Columns are ``columns`` then any other keys the rows carry. Floats are written with
    ``repr``, so they read back exactly; None is an empty field.
    """
    extra = [key for row in rows for key in row if key not in columns]
    fields = list(columns) + list(dict.fromkeys(extra))
    with open(path, "w", newline="") as f:
        for key, value in meta.items():
            f.write(f"# {key}: {value}\n")
        writer = csv.writer(f)
        writer.writerow(fields)
        for row in rows:
            writer.writerow([_field(row.get(k)) for k in fields])


def _field(value):
    """None -> "", floats (NumPy's too) by repr so they read back exactly, else str."""
    if value is None:
        return ""
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    return str(value)


def _parse(field):
    if field == "":
        return None
    for kind in (int, float):
        try:
            return kind(field)
        except ValueError:
            pass
    return field


def read_csv(path):
    """The rows a figure function wrote, as dicts of int, float, str or None, and its meta."""
    meta, lines = {}, []
    with open(path, newline="") as f:
        for line in f:
            if line.startswith("# "):
                key, _, value = line[2:].rstrip("\n").partition(": ")
                meta[key] = value
            else:
                lines.append(line)
    rows = [{k: _parse(v) for k, v in row.items()} for row in csv.DictReader(lines)]
    return rows, meta


# ---- drawing ---------------------------------------------------------------------------------

def _value(row, key):
    """row[key] as a float, or None when missing or NaN."""
    value = row.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
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
    """The log-log slope of ys against xs, fitted over the larger half of xs (None if < 2)."""
    keep = xs >= np.median(xs)
    if keep.sum() < 2:
        return None
    return float(np.polyfit(np.log(xs[keep]), np.log(ys[keep]), 1)[0])


def _check_rows(rows, x, columns):
    if not rows:
        raise ValueError("no rows to draw")
    for key in ("name", x):
        missing = [row for row in rows if key not in row]
        if missing:
            raise ValueError(f"every row needs {key!r} (schema {columns}); got {missing[0]}")
    if any(float(row[x]) <= 0 for row in rows):
        raise ValueError(f"{x} must be positive on a log axis, got {min(r[x] for r in rows)}")


def _draw(ax, series, names, fit, scale=1.0):
    """One curve per name: median with markers, a min-max band, the slope in the legend.
    ``names`` (all the figure's names, in order) fixes each name's colour and marker."""
    for name, (xs, med, low, high) in sorted(series.items()):
        i = names.index(name)
        fitted = slope(xs, med) if fit else None
        label = name if fitted is None else f"{name} (slope {round(fitted, 2) + 0.0:.2f})"
        ax.plot(xs, med * scale, marker=MARKERS[i % len(MARKERS)], color=f"C{i % 10}",
                label=label)
        if np.any(high > low):
            ax.fill_between(xs, low * scale, high * scale, color=f"C{i % 10}", alpha=0.2)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)


def _figure(rows, path, x, columns, schema, xlabel, ylabel, title, scale=1.0, fit=True):
    """Draw one log-log panel per column that has data; write path.png and path.csv."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    _check_rows(rows, x, schema)
    panels = [(c, _series(rows, x, c)) for c in columns]
    panels = [(c, s) for c, s in panels if s]
    if not panels:
        raise ValueError(f"no values in columns {columns}")
    fig = Figure(figsize=(5.2 * len(panels), 4), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    names = sorted({name for _, series in panels for name in series})
    for ax, (column, series) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        _draw(ax, series, names, fit, scale)
        ax.set(xlabel=xlabel, ylabel=ylabel, title=LABELS.get(column, column))
    if title and len(panels) == 1:
        ax.set_title(title)                 # one panel: the title replaces the column's name
    elif title:
        fig.suptitle(title)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    png, table = path.with_suffix(".png"), path.with_suffix(".csv")
    fig.savefig(png)
    write_csv(table, rows, schema, {"figure": path.stem, **machine()})
    return png, table


def time_vs_n(rows, path, title=None):
    """Time per call against sequence length N, log-log: one panel for the forward pass and
    one for forward + backward (when the rows have it). Rows: TIME_COLUMNS.

    Returns the paths of the PNG and CSV written.
    """
    return _figure(rows, path, "n", ("seconds_fwd", "seconds_fwdbwd"), TIME_COLUMNS,
                   "sequence length N", "seconds per call", title)


def memory_vs_n(rows, path, title=None):
    """Peak memory against sequence length N, log-log, in MiB. Rows: MEMORY_COLUMNS."""
    return _figure(rows, path, "n", ("peak_bytes",), MEMORY_COLUMNS, "sequence length N",
                   "peak memory (MiB)", title, scale=2.0 ** -20)


def time_per_token(rows, path, title=None):
    """Seconds to generate one token against its position (the context length, from 1),
    log-log: an RNN state costs the same at every position, a key/value cache grows.
    Rows: TOKEN_COLUMNS."""
    return _figure(rows, path, "position", ("seconds_per_token",), TOKEN_COLUMNS,
                   "position (tokens in the context)", "seconds per token", title)


def feature_map_error(rows, path, title=None):
    """Relative error of feature maps against softmax, against the number of features F:
    of the kernel matrix phi(Q) phi(K)^T versus exp(Q K^T / sqrt(D)) (Eq. 4), and of the
    attention output versus softmax attention (Eq. 2). Rows: FEATURE_MAP_COLUMNS; repeats
    over seeds give the band."""
    return _figure(rows, path, "n_features", ("kernel_error", "output_error"),
                   FEATURE_MAP_COLUMNS, "number of features F", "relative error", title)


# ---- measurements that need only the core ---------------------------------------------------

def _relative(got, want):
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def measure_feature_map_error(n_features=(4, 16, 64, 256, 1024, 4096), seeds=range(8), n=128,
                              d=16, m=16, scale=0.5, data_seed=0):
    """Rows for ``feature_map_error`` on one random q, k, v: q, k = ``scale`` * N(0, 1) of
    shape (N, D), v = N(0, 1) of shape (N, M).

    FAVOR+ (``Favor``) at each F and seed, against the softmax kernel exp(q.k / sqrt(D)) and
    softmax attention; the deterministic maps once, at their own F: Taylor (q, k scaled by
    D^(-1/4), so its kernel is the 2nd-order expansion of that exp), elu+1 and relu (other
    kernels: output error only). One FAVOR feature's relative variance is
    exp(|q' + k'|^2) - 1 with x' = x / D^(1/4): raise ``scale`` to see the error grow.
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


def _feature_maps(out, quick):
    if quick:
        rows = measure_feature_map_error(n_features=(4, 16, 64, 256), seeds=range(3))
    else:
        rows = measure_feature_map_error()
    return feature_map_error(rows, out / "feature_map_error",
                             title="Feature maps against softmax: N = 128, D = 16, "
                                   "q, k ~ 0.5 N(0, 1)")


# The figures ``main`` regenerates: (name, function(out_dir, quick) -> paths). The timing and
# memory figures join this list once ``linattn.bench`` provides their rows.
FIGURES = [("feature_map_error", _feature_maps)]


def main(argv=None):
    """``python -m linattn.figures [--quick] [--out DIR]``: regenerate every figure."""
    parser = argparse.ArgumentParser(
        prog="python -m linattn figures",
        description="Measure afresh and write each figure as a PNG with a CSV beside it.")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("figures"),
                        help="output folder (default: figures)")
    args = parser.parse_args(argv)
    for i, (name, make) in enumerate(FIGURES, 1):
        print(f"[{i}/{len(FIGURES)}] {name} ...", end="", flush=True)
        start = time.perf_counter()
        paths = make(args.out, args.quick)
        print(f" {time.perf_counter() - start:.1f} s -> {', '.join(map(str, paths))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
