"""Writing column arrays as CSV, byte for byte as ``pandas.DataFrame.to_csv`` wrote them.

Why: pandas formats every float through a Python lambda plus NaN checks per cell, which took
longer than the simulation itself for 300k steps. Here a chunk of rows is formatted with one
``%``-template per row (float columns ``%.9g``, integer columns ``%d``, strings ``%s``), so the
per-cell work is C code.

The format is the one ``write_results`` has always produced with
``to_csv(index=False, float_format="%.9g")``: a header of the column names; float cells as
``"%.9g" % v`` with NaN written as an empty cell (pandas' ``na_rep``); integer cells as
``str(v)``; string cells quoted only when they hold a comma, a quote or a line break (csv's
QUOTE_MINIMAL, quotes doubled); ``\\n`` line ends. ``tests/test_streaming.py`` checks it
against pandas.
"""

from __future__ import annotations

import numpy as np

CHUNK_ROWS = 65536  # rows formatted at once (bounds the text held in memory)


def _quote(s: str) -> str:
    if any(c in s for c in ',"\n\r'):
        return '"' + s.replace('"', '""') + '"'
    return s


def _cells(col: np.ndarray) -> tuple[str, list]:
    """The ``%``-template of one column and its values as Python objects for ``%``."""
    if col.dtype.kind == "f":
        vals = col.tolist()
        if np.isnan(col).any():
            # %-formatting on purpose: pandas applied float_format with %, byte for byte
            return "%s", ["" if v != v else "%.9g" % v for v in vals]  # noqa: UP031
        return "%.9g", vals
    if col.dtype.kind in "iu":
        return "%d", col.tolist()
    vals = [str(v) for v in col.tolist()]
    # few distinct strings (a status, a reject reason): quote each once
    quoted = {v: _quote(v) for v in set(vals)}
    return "%s", [quoted[v] for v in vals]


def format_rows(columns: dict[str, np.ndarray], start: int, stop: int) -> str:
    """Rows ``start:stop`` of ``columns`` as CSV text (each row ends with a line break)."""
    templates, values = [], []
    for col in columns.values():
        t, v = _cells(np.asarray(col[start:stop]))
        templates.append(t)
        values.append(v)
    if stop <= start:
        return ""
    row = ",".join(templates)
    return "\n".join([row % t for t in zip(*values, strict=True)]) + "\n"


def write_csv(path, columns: dict[str, np.ndarray], header: bool = True) -> None:
    """Write ``columns`` (equal-length arrays, in order) to ``path`` in chunks of rows."""
    n = len(next(iter(columns.values()))) if columns else 0
    with open(path, "w", newline="") as f:
        if header:
            f.write(",".join(_quote(k) for k in columns) + "\n")
        for start in range(0, n, CHUNK_ROWS):
            f.write(format_rows(columns, start, min(start + CHUNK_ROWS, n)))
