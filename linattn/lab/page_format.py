"""Reading the lab's files and writing Markdown tables: the performance page's small tools.

Each figure's CSV carries ``# key: value`` lines (machine, date, tier); ``_csv`` returns
them beside the rows. The table helpers format numbers to a few significant digits and
never invent one: a missing value prints "-".
"""
import json

import numpy as np

from .figures import read_csv


def _json(path):
    return json.loads(path.read_text()) if path.exists() else None


def _csv(path):
    """(rows, meta) of a figure's CSV, or (None, {}) when the file is missing."""
    return read_csv(path) if path.exists() else (None, {})


def _source(path, meta):
    """"`NAME.csv`, DATE" and, when the CSV says it, the command that wrote it (``make
    figures`` or ``make paper``, its ``# tier:`` line)."""
    tier = f", make {meta['tier']}" if meta.get("tier") else ""
    return f"`{path.name}`, {meta.get('date')}{tier}"


def _sig(x, digits=3):
    """x with ``digits`` significant digits, "-" for a missing value."""
    if x is None or (isinstance(x, float) and np.isnan(x)):
        return "-"
    if abs(x) >= 10 ** digits:
        return f"{x:.0f}"                                  # 1234, not 1.23e+03
    return f"{x:.{digits}g}"


def _table(head, rows, align=None):
    """A Markdown table: ``head`` a list of column titles, ``rows`` lists of cells."""
    align = align or ["---"] + ["---:"] * (len(head) - 1)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _pivot(rows, key, x, scale=1.0):
    """{name: {x: median of row[key] * scale}} over the rows that have a value."""
    groups = {}
    for row in rows:
        if row.get(key) is not None:
            groups.setdefault(str(row["name"]), {}).setdefault(row[x], []).append(row[key])
    return {name: {xv: float(np.median(v)) * scale for xv, v in by_x.items()}
            for name, by_x in groups.items()}


def _ms(seconds):
    return None if seconds is None else seconds * 1e3


def _missing(title, path):
    return f"## {title}\n\nNot in this run: `{path}` is missing."
