"""The CSV beside each figure's PNG: ``# key: value`` lines (the figure, the machine, the
date, the tier that measured it), then the rows, written so that they read back exactly.

``write_csv`` and ``read_csv`` are re-exported by ``linattn.lab.figures``, whose figure
functions write one of these beside every PNG, for the figures of Katharopoulos et al.
(2020), arXiv:2006.16236.
"""
import csv
import datetime
import os
import platform

import numpy as np


def machine():
    """The machine and date a measurement ran on, as a dict of short strings."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.platform()}, {platform.machine()}, {os.cpu_count()} CPUs",
            "python": platform.python_version(), "numpy": np.__version__}


TIERS = ("figures", "paper")


def write_csv(path, rows, columns, meta, tier="figures"):
    """Write ``rows`` to ``path``: ``# key: value`` lines for ``meta`` and ``# tier: TIER``,
    then a CSV table. ``tier`` names the command that measured the rows: "figures" (``make
    figures``, the sizes two cores draw in about 40 minutes) or "paper" (``make paper``,
    ``linattn.lab.paper``: the paper's sizes, hours); both write the same file names.

    Columns are ``columns`` then any other keys the rows carry. Floats are written with
    ``repr``, so they read back exactly; None is an empty field.
    """
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {', '.join(TIERS)}, got {tier!r}")
    meta = {**meta, "tier": tier}
    extra = [key for row in rows for key in row if key not in columns]
    fields = list(columns) + list(dict.fromkeys(extra))
    with open(path, "w", newline="") as f:
        for key, value in meta.items():
            flat = " ".join(str(value).split("\n"))           # one line a key
            f.write(f"# {key}: {flat}\n")
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
