"""Trace file loaders: Azure LLM 2023 CSV, Mooncake JSONL, Vidur/Etalon length CSVs.

Why one module: every format is read into the same column arrays (``Trace``), and every bad row
is reported the same way, as a ``TraceFormatError`` (a ``ConfigError``) naming the trace file, the
line (1-based, as an editor shows it; the CSV header is line 1), the data row and the column.

Invariants of a returned ``Trace``:

* ``num_prompt_tokens`` > 0 and ``num_output_tokens`` >= 0, int64. A zero output length is legal
  here; the caller decides what it means (``workloads.build`` clamps or drops it and counts it).
* ``arrival_s`` is None (lengths-only file) or float64 >= 0, non-decreasing. Rows are stably
  sorted by arrival when the file is not; ``num_reordered`` says how many rows moved.
* ``hash_ids`` is None or one tuple per row with ``len == ceil(prompt / hash_block_size)``.

The parsers use the ``csv`` and ``json`` modules directly (not pandas) so that line numbers stay
exact; the shipped traces load in tens of milliseconds.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import warnings
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path

import numpy as np

from simulator.errors import ConfigError
from simulator.files import DuplicateKey, loads_json_unique, read_text, repeated_column

FORMATS = ("azure", "mooncake", "lengths", "vidur")
MOONCAKE_BLOCK_SIZE = 512

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
LENGTH_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")
VIDUR_COLUMNS = ("arrived_at", *LENGTH_COLUMNS)
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")


class TraceFormatError(ConfigError):
    """A bad trace file: ``where`` is the trace path, ``key`` its line and row, if known."""

    def __init__(self, path: Path, message: str, line: int = 0, row: int = 0, column: str = ""):
        self.path = Path(path)
        self.line = line
        self.row = row
        self.column = column
        if not line:
            key = ""
        elif row:
            key = f"line {line} (data row {row})"
        else:
            key = f"line {line} (header)"
        if column:
            message = f"column {column!r}: {message}"
        super().__init__(str(path), key, message)


@dataclass(frozen=True, eq=False)
class Trace:
    """One trace file as read-only column arrays, rows sorted by arrival (module invariants)."""

    path: Path
    format: str
    num_prompt_tokens: np.ndarray
    num_output_tokens: np.ndarray
    arrival_s: np.ndarray | None = None
    hash_ids: list[tuple[int, ...]] | None = None
    hash_block_size: int | None = None
    num_reordered: int = 0

    def __post_init__(self):
        for array in (self.num_prompt_tokens, self.num_output_tokens, self.arrival_s):
            if array is not None:
                array.setflags(write=False)  # shared by every build that uses this trace

    def __len__(self) -> int:
        return len(self.num_prompt_tokens)


def detect_format(path: Path) -> str:
    """Guess the format: ``.jsonl``/``.json`` is mooncake, a CSV by its header's columns."""
    path = Path(path)
    if path.suffix.lower() in (".jsonl", ".json"):
        return "mooncake"
    header, line = _csv_header(path)
    columns = set(header)
    if set(AZURE_COLUMNS) <= columns:
        return "azure"
    if set(VIDUR_COLUMNS) <= columns:
        return "vidur"
    if set(LENGTH_COLUMNS) <= columns:
        return "lengths"
    raise TraceFormatError(
        path,
        f"cannot tell the trace format from the columns {header}; expected {list(AZURE_COLUMNS)}"
        f" (azure), {list(VIDUR_COLUMNS)} (vidur) or {list(LENGTH_COLUMNS)} (lengths), or a .jsonl"
        " file (mooncake); or set the format explicitly",
        line=line,
    )


def load_trace(
    path: Path, fmt: str = "auto", *, hash_block_size: int = MOONCAKE_BLOCK_SIZE
) -> Trace:
    """Read a trace file of format ``fmt`` (one of ``FORMATS`` or "auto")."""
    path = Path(path)
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt == "azure":
        return _load_azure(path)
    if fmt == "mooncake":
        return _load_mooncake(path, hash_block_size)
    if fmt == "vidur":
        return _load_length_csv(path, with_arrivals=True)
    if fmt == "lengths":
        return _load_length_csv(path, with_arrivals=False)
    raise ValueError(f"unknown trace format {fmt!r}; expected auto or one of {FORMATS}")


def read_length_column(path: Path, column: str) -> np.ndarray:
    """All values of one column (CSV) or field (JSONL) as positive int64, for empirical lengths."""
    path = Path(path)
    if path.suffix.lower() in (".jsonl", ".json"):
        lines, records = _jsonl_records(path)
        col = Column(column, [rec.get(column, _MISSING) for rec in records], lines)
    else:
        col = _csv_columns(path, (column,))[column]
    return _int_array(path, col, minimum=1)


# ---------------------------------------------------------------------------- formats


def _load_azure(path: Path) -> Trace:
    cols = _csv_columns(path, AZURE_COLUMNS)
    prompt = _int_array(path, cols["ContextTokens"], minimum=1)
    output = _int_array(path, cols["GeneratedTokens"], minimum=0)
    nanos = _wall_clock_ns(path, cols["TIMESTAMP"])
    arrival = (nanos - nanos.min()) / 1e9
    return _sorted_trace(path, "azure", prompt, output, arrival)


def _wall_clock_ns(path: Path, col: Column) -> np.ndarray:
    """ISO-8601 wall-clock strings ("2023-11-16 18:15:46.6805900") as int64 nanoseconds."""
    example = "expected a timestamp like 2023-11-16 18:15:46.6805900, got {value}"
    with warnings.catch_warnings():
        # a UTC offset ("...46Z", "...46+01:00") is applied, which is right for arrival gaps;
        # numpy's deprecation warning about it would only look like a crash to the user
        warnings.filterwarnings("ignore", "no explicit representation of timezones")
        try:
            stamps = np.array(col.values, dtype="datetime64[ns]")
        except ValueError:
            for i, value in enumerate(col.values):
                try:
                    np.datetime64(value, "ns")
                except ValueError:
                    raise col.error(path, i, example) from None
            raise AssertionError("unreachable: the array parse failed, so a cell is bad") from None
    missing = np.flatnonzero(np.isnat(stamps))
    if len(missing):
        raise col.error(path, missing[0], example)
    _refuse_mixed_zones(path, col)
    return stamps.astype(np.int64)


#: a timestamp's UTC offset: after its time of day ("T18:15:46.5", " 18:15"), so that the
#: dashes of a date are not taken for one; MULTILINE: it also runs over all cells joined
_ZONE = re.compile(r"[T ]\d\d[\d:.,]*(Z|[+-]\d\d(?::?\d\d)?)[ \t]*$", re.MULTILINE)


def _utc_offset_min(value: str) -> int | None:
    """A timestamp's UTC offset in minutes ("Z" is 0), or None when it has none (naive)."""
    match = _ZONE.search(value)
    if match is None:
        return None
    zone = match[1]
    if zone == "Z":
        return 0
    digits = zone[1:].replace(":", "")
    minutes = int(digits[:2]) * 60 + int(digits[2:] or 0)
    return -minutes if zone[0] == "-" else minutes


def _refuse_mixed_zones(path: Path, col: Column) -> None:
    """Raise at the first row whose UTC offset differs from the first row's. numpy takes a
    zone-less time as UTC, so a trace mixing zone-less and zoned times (or a zone switch a
    tool made mid-file) would get a gap between its rows that no request had.

    Fast paths (a regex over 20k rows cost 8 ms, a third of the load): no "Z", no "+" and no
    "-" past a row's date ("YYYY-MM-DD") mean no zone at all; else one regex pass over all
    cells settles one zone written alike on every row. Only otherwise is each row compared."""
    text, rows = "\n".join(col.values), len(col.values)
    if "Z" not in text and "+" not in text and not any("-" in v[10:] for v in col.values):
        return
    zones = _ZONE.findall(text)
    if len(zones) == rows and len(set(zones)) == 1:
        return
    offsets = list(map(_utc_offset_min, col.values))
    for i, offset in enumerate(offsets):
        if offset != offsets[0]:
            raise col.error(
                path, i, f"expected every timestamp in the first row's time zone "
                f"({_zone_name(offsets[0])}), got {{value}} ({_zone_name(offset)}); write them "
                "all in one zone"
            )  # fmt: skip


def _zone_name(offset: int | None) -> str:
    if offset is None:
        return "no zone"
    sign = "-" if offset < 0 else "+"
    return f"UTC{sign}{abs(offset) // 60:02d}:{abs(offset) % 60:02d}"


def _load_length_csv(path: Path, with_arrivals: bool) -> Trace:
    cols = _csv_columns(path, VIDUR_COLUMNS if with_arrivals else LENGTH_COLUMNS)
    prompt = _int_array(path, cols["num_prefill_tokens"], minimum=1)
    output = _int_array(path, cols["num_decode_tokens"], minimum=0)
    if not with_arrivals:
        return Trace(path, "lengths", prompt, output)
    arrival = _time_array(path, cols["arrived_at"], units_per_s=1.0)
    return _sorted_trace(path, "vidur", prompt, output, arrival)


def _load_mooncake(path: Path, block_size: int) -> Trace:
    lines, records = _jsonl_records(path)
    cols = {
        name: Column(name, [rec.get(name, _MISSING) for rec in records], lines)
        for name in (*MOONCAKE_FIELDS, "hash_ids")
    }
    prompt = _int_array(path, cols["input_length"], minimum=1)
    output = _int_array(path, cols["output_length"], minimum=0)
    arrival = _time_array(path, cols["timestamp"], units_per_s=1000.0)
    hashes = None
    if "hash_ids" in records[0]:  # optional, but then on every row
        hashes = _hash_tuples(path, cols["hash_ids"], prompt, block_size)
    trace = _sorted_trace(path, "mooncake", prompt, output, arrival, hashes)
    if hashes is not None:
        trace = replace(trace, hash_block_size=block_size)
    return trace


def _sorted_trace(path, fmt, prompt, output, arrival, hashes=None) -> Trace:
    """Sort rows stably by arrival (a no-op for the shipped traces) and count moved rows."""
    if np.all(np.diff(arrival) >= 0):
        return Trace(path, fmt, prompt, output, arrival, hashes)
    order = np.argsort(arrival, kind="stable")
    moved = int(np.count_nonzero(order != np.arange(len(order))))
    if hashes is not None:
        hashes = [hashes[i] for i in order]
    return Trace(path, fmt, prompt[order], output[order], arrival[order], hashes, None, moved)


# ---------------------------------------------------------------------------- cells

_MISSING = object()
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class Column:
    """Raw cells of one column (str from CSV, JSON values from JSONL) and each row's file line."""

    name: str
    values: list
    lines: list[int]

    def error(self, path: Path, index: int, message: str) -> TraceFormatError:
        """An error for data row ``index`` (0-based); ``{value}`` in message shows the cell."""
        text = message.format(value=_show(self.values[index]))
        return TraceFormatError(path, text, self.lines[index], int(index) + 1, self.name)


def _csv_header(path: Path) -> tuple[list[str], int]:
    with _open(path) as handle:
        reader = csv.reader(handle)
        return _header(path, reader), reader.line_num


def _header(path: Path, reader) -> list[str]:
    """The first non-empty row, stripped; an empty file is an error, and so is a column named
    twice (every reader would silently take the first of the two)."""
    try:
        for fields in reader:
            if fields:
                header = [f.strip() for f in fields]
                _refuse_repeated_columns(path, header, reader.line_num)
                return header
    except csv.Error as exc:
        raise _csv_error(path, exc, reader.line_num, 0) from None
    raise TraceFormatError(path, "the file is empty (no CSV header)")


def _refuse_repeated_columns(path: Path, header: list[str], line: int) -> None:
    """Raise on a column name the header gives twice (`repeated_column`)."""
    name = repeated_column(header)
    if name is not None:
        raise TraceFormatError(path, f"column {name!r} is named twice; keep one", line)


def _csv_error(path: Path, exc: csv.Error, line: int, row: int) -> TraceFormatError:
    """The csv module's own errors (a field over its 128 KiB limit, a NUL byte) as a bad row."""
    return TraceFormatError(path, f"not valid CSV ({exc})", line, row)


def _csv_columns(path: Path, wanted: tuple[str, ...]) -> dict[str, Column]:
    """The ``wanted`` columns; a missing column or a row with too few/many fields is an error.

    Only empty lines are skipped; a line of empty fields (",,") is a row with empty cells.
    """
    with _open(path) as handle:
        reader = csv.reader(handle)
        header = _header(path, reader)
        missing = [name for name in wanted if name not in header]
        if missing:
            raise TraceFormatError(
                path, f"missing column(s) {missing}; the header has {header}", reader.line_num
            )
        rows: list[list[str]] = []
        lines: list[int] = []
        try:
            _read_rows(path, reader, len(header), rows, lines)
        except csv.Error as exc:
            raise _csv_error(path, exc, reader.line_num, len(rows) + 1) from None
    if not rows:
        raise TraceFormatError(path, "the file has a header but no data rows")
    out = {}
    for name in wanted:
        i = header.index(name)
        out[name] = Column(name, [fields[i] for fields in rows], lines)
    return out


def _read_rows(path: Path, reader, width: int, rows: list, lines: list) -> None:
    """Append every data row (and its line) to ``rows``/``lines``; empty lines are skipped."""
    for fields in reader:
        if len(fields) != width:
            if not fields:
                continue  # an empty line
            raise TraceFormatError(
                path,
                f"expected {width} fields like the header, got {len(fields)}",
                reader.line_num,
                len(rows) + 1,
            )
        rows.append(fields)
        lines.append(reader.line_num)


def _jsonl_records(path: Path) -> tuple[list[int], list[dict]]:
    """Rows of a JSON-lines file and their line numbers; empty lines are skipped.

    Fast path: parse all lines as one JSON array (one C call instead of one per line). If that
    fails, parse line by line to name the first bad line. A key given twice in one object is
    an error (json would keep the last silently; `simulator.files.loads_json_unique`).
    """
    with _open(path) as handle:
        texts = handle.read().split("\n")  # not splitlines(): JSON strings may hold U+2028
    lines = [i for i, text in enumerate(texts, start=1) if text.strip()]
    try:
        records = loads_json_unique("[" + ",".join(texts[i - 1] for i in lines) + "]")
    except (json.JSONDecodeError, RecursionError, DuplicateKey):
        records = None
    if records is None or len(records) != len(lines):
        records = []
        for row, line in enumerate(lines, start=1):
            try:
                records.append(loads_json_unique(texts[line - 1]))
            except json.JSONDecodeError as exc:
                raise TraceFormatError(path, f"not valid JSON ({exc.msg})", line, row) from None
            except RecursionError:
                raise TraceFormatError(path, "JSON nested too deeply", line, row) from None
            except DuplicateKey as exc:
                twice = "key given twice in one object (JSON would keep the last silently)"
                raise TraceFormatError(path, twice, line, row, exc.key) from None
    if not records:
        raise TraceFormatError(path, "the file has no JSON rows")
    if set(map(type, records)) != {dict}:
        row = next(i for i, rec in enumerate(records) if type(rec) is not dict)
        raise TraceFormatError(
            path, f"expected a JSON object, got {_show(records[row])}", lines[row], row + 1
        )
    return lines, records


def _int_array(path: Path, col: Column, minimum: int) -> np.ndarray:
    """Cells as int64 >= ``minimum``; the first bad cell raises, naming line, row and column.

    Fast path: all cells are text (CSV) or all are JSON ints. Anything else takes the exact,
    cell-by-cell path, which also accepts integral floats such as "12.0" that some tools write.
    """
    types = set(map(type, col.values))
    try:
        if types == {str}:
            values = np.array(list(map(int, col.values)), dtype=np.int64)
        elif types == {int}:
            values = np.array(col.values, dtype=np.int64)
        else:
            raise ValueError
    except (ValueError, OverflowError):
        parsed = [_int_or_none(value) for value in col.values]
        for i, value in enumerate(parsed):
            if value is None or not _INT64_MIN <= value <= _INT64_MAX:
                raise col.error(path, i, "expected an integer, got {value}") from None
        values = np.array(parsed, dtype=np.int64)
    low = np.flatnonzero(values < minimum)
    if len(low):
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise col.error(path, low[0], f"expected {what}, got {{value}}")
    return values


def _int_or_none(value) -> int | None:
    """Integers, and integral floats (12.0 or "12.0"); never bools, lists or missing cells."""
    if type(value) is int:
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    elif type(value) is not float:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return int(number) if math.isfinite(number) and number.is_integer() else None


def _time_array(path: Path, col: Column, units_per_s: float) -> np.ndarray:
    """Cells as finite times >= 0, in seconds (divided, not multiplied: 3536999 ms -> 3536.999)."""
    types = set(map(type, col.values))
    try:
        if types == {str}:
            values = np.array(list(map(float, col.values)), dtype=np.float64)
        elif types <= {int, float}:
            values = np.array(col.values, dtype=np.float64)
        else:
            raise ValueError
    except (ValueError, OverflowError):
        for i, value in enumerate(col.values):
            try:
                if type(value) not in (str, int, float):
                    raise ValueError
                float(value)
            except ValueError:
                raise col.error(path, i, "expected a number, got {value}") from None
        raise AssertionError("unreachable: the fast path failed, so some cell is bad") from None
    bad = np.flatnonzero(~(np.isfinite(values) & (values >= 0)))
    if len(bad):
        raise col.error(path, bad[0], "expected a finite time >= 0, got {value}")
    return values / units_per_s if units_per_s != 1.0 else values


def _hash_tuples(
    path: Path, col: Column, prompt: np.ndarray, block_size: int
) -> list[tuple[int, ...]]:
    """Block ids per row: a list of ints >= 0, ceil(prompt / block_size) long (covers the prompt).

    Fast path: check all ids at once; only on failure walk the rows to name the first bad one.
    """
    values = col.values
    need = -(-prompt // block_size)
    if set(map(type, values)) == {list}:
        counts = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
        flat = list(chain.from_iterable(values))
        if (
            np.array_equal(counts, need)
            and (not flat or set(map(type, flat)) == {int})
            and (not flat or min(flat) >= 0)
        ):
            return list(map(tuple, values))
    for i, value in enumerate(values):
        if type(value) is not list or (
            value and (set(map(type, value)) != {int} or min(value) < 0)
        ):
            raise col.error(path, i, "expected a list of integer block ids >= 0, got {value}")
        if len(value) != need[i]:
            raise col.error(
                path,
                i,
                f"expected ceil(input_length / {block_size}) = {need[i]} block ids,"
                f" got {len(value)}",
            )
    raise AssertionError("unreachable: the fast path failed, so some row is bad")


def _open(path: Path) -> io.StringIO:
    """The file's text (UTF-8, BOM dropped, line ends kept for the csv module); a missing,
    unreadable, binary or non-UTF-8 file is a TraceFormatError naming it."""
    try:
        text = read_text(path, "trace file")
    except ConfigError as exc:
        detail = f"{exc.key}: {exc.message}" if exc.key else exc.message
        raise TraceFormatError(path, detail) from None
    return io.StringIO(text, newline="")


def _show(value) -> str:
    if value is _MISSING:
        return "nothing (missing)"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
