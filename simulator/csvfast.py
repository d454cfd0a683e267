"""Writing column arrays as CSV, byte for byte as ``pandas.DataFrame.to_csv`` wrote them.

Why: pandas formats every float through a Python lambda plus NaN checks per cell, which took
longer than the simulation itself for 300k steps; a ``%``-template per row (the next version)
still spent ~75 ns a cell in C, ~0.5 s of a 100k-request run. Here a chunk of rows is built as
a matrix of ASCII bytes with numpy, one fixed-width block of columns per CSV column, cells
padded with NUL bytes that are dropped at the end (``bytes.translate``): the per-cell work is
array arithmetic, not Python.

The format is the one ``write_results`` has always produced with
``to_csv(index=False, float_format="%.9g")`` (UTF-8, pandas' default): a header of the column
names; float cells as ``"%.9g" % v`` with NaN written as an empty cell (pandas' ``na_rep``);
integer cells as ``str(v)``; string cells quoted only when they hold a comma, a quote or a line
break (csv's QUOTE_MINIMAL, quotes doubled); ``\\n`` line ends. A float is formatted by numpy
when its ``%.9g`` is plain decimal (exponent -4 to 8) and its 9-digit rounding is unambiguous
(see `_float_cells`); any other cell (exponent notation, inf, a near-tie, a string holding a
NUL) is formatted by Python as before. ``tests/test_streaming.py`` checks it against pandas and
``tests/test_csvfast.py`` against ``%.9g`` on edge values.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Fill = Callable[[np.ndarray], None]

CHUNK_ROWS = 65536  # rows formatted at once (bounds the text held in memory)

_DIGIT0, _POINT, _MINUS = 48, 46, 45  # "0", ".", "-"
_SCALE = np.array([float(10**k) for k in range(13)])  # exact powers of ten for the digits
#: %.9g's plain-decimal exponents (X in 1.2345e X)
_EXP_MIN, _EXP_MAX = -4, 8
#: a float's scaled value this close to half an integer could round either way: Python decides
_TIE_MARGIN = 1e-6
#: a plain-decimal cell's byte slots: the sign, "0." and up to three more "0"s for X < 0, then
#: the 9 significant digits, each but the last followed by the slot of a "." (used at X = j)
_LEAD_ZEROS = (1, 3, 4, 5)  # slot of the "0" shown when X <= -1, -2, -3, -4
_LEAD_POINT = 2
_DIGIT_SLOTS = tuple(range(6, 23, 2))
_POINT_SLOTS = tuple(range(7, 22, 2))
_FLOAT_WIDTH = 23


def _quote(s: str) -> str:
    if any(c in s for c in ',"\n\r'):
        return '"' + s.replace('"', '""') + '"'
    return s


def _text_matrix(texts: list[str]) -> np.ndarray:
    """``texts`` (ASCII or UTF-8) as an (n, width) uint8 matrix, each row NUL-padded."""
    encoded = [t.encode() for t in texts]
    width = max(map(len, encoded), default=0) or 1
    return np.array(encoded, dtype=f"S{width}").view(np.uint8).reshape(len(texts), width)


def _copied(cells: np.ndarray) -> tuple[int, Fill]:
    """Cells already made as a byte matrix: its width, and the fill that copies it."""

    def fill(out: np.ndarray) -> None:
        out[:] = cells

    return cells.shape[1], fill


def _small_ints(a: np.ndarray) -> np.ndarray:
    """``a`` as int32 when it fits (half the memory traffic per digit), else int64."""
    if len(a) and -(2**31) < a.min() and a.max() < 2**31:
        return a.astype(np.int32)
    return a.astype(np.int64)


def _int_cells(col: np.ndarray) -> tuple[int, Fill]:
    """``str(v)`` of each integer: a "-" or NUL, then the digits, leading zeros as NUL (the
    units digit always shown)."""
    if (col.dtype.kind == "u" and len(col) and col.max() > np.iinfo(np.int64).max) or (
        col.dtype.kind == "i" and len(col) and col.min() == np.iinfo(np.int64).min
    ):  # beyond int64, or |v| overflows it
        return _copied(_text_matrix([str(v) for v in col.tolist()]))
    v = _small_ints(col)
    width = len(str(int(np.abs(v).max(initial=0))))

    def fill(out: np.ndarray) -> None:
        out[:, 0] = (v < 0) * _MINUS
        m = np.abs(v)
        for j in range(width, 0, -1):
            q = m // 10
            digit = m - q * 10 + _DIGIT0
            out[:, j] = digit if j == width else digit * (m != 0)
            m = q

    return width + 1, fill


def _scaled(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For positive finite ``a``: the decimal exponent X, the 9 significant digits as an int
    (``a`` rounded at 9 digits) and whether numpy may format it (X in -4..8, rounding certain).

    ``a * 10**(8 - X)`` is rounded once (10**k is exact), so it is within 1.2e-7 of the exact
    product when below 1e9; its nearest integer is the exact one unless the fraction is within
    that of .5 (then Python decides: it rounds the exact binary value, ties to even). A product
    outside [1e8, 1e9 - 0.5) means log10 was off by one near a power of ten or the rounding
    carries into a tenth digit: Python decides those too.
    """
    x = np.floor(np.log10(a)).astype(np.int64)
    m = a * _SCALE[np.clip(8 - x, 0, 12)]
    frac = m - np.floor(m)
    sure = (
        (m >= 1e8) & (m < 1e9 - 0.5 - _TIE_MARGIN) & (np.abs(frac - 0.5) > _TIE_MARGIN)
        & (x >= _EXP_MIN) & (x <= _EXP_MAX)
    )  # fmt: skip
    return np.where(sure, x, 0), np.rint(np.where(sure, m, 1e8)).astype(np.int32), sure


def _plain_decimal(x: np.ndarray, sig: np.ndarray, out: np.ndarray) -> None:
    """%.9g's plain-decimal text of ``sig`` x 10**(X - 8) into ``out``'s slots (see above; the
    sign's left as it is): X >= 0 "ddd.dddddd", X < 0 "0.000ddddddddd", the fraction's
    trailing zeros cut, and then a bare "."."""
    for i, slot in enumerate(_LEAD_ZEROS):
        out[:, slot] = (x <= -1 - i) * _DIGIT0
    out[:, _LEAD_POINT] = (x < 0) * _POINT
    m, zeros_after = sig, np.ones(len(x), bool)  # all digits after this one are 0
    for j in range(8, -1, -1):
        q = m // 10
        digit = m - q * 10
        if j < 8:  # the "." after digit j, kept when some fraction digit is not 0
            out[:, _POINT_SLOTS[j]] = ((x == j) & ~zeros_after) * _POINT
        zeros_after &= digit == 0
        out[:, _DIGIT_SLOTS[j]] = (digit + _DIGIT0) * ~(zeros_after & (x < j))
        m = q


def _float_cells(col: np.ndarray) -> tuple[int, Fill]:
    """``"%.9g" % v`` of each float, NaN an empty cell (at most 16 bytes: fits the slots)."""
    v = col.astype(np.float64, copy=False)

    def fill(out: np.ndarray) -> None:
        with np.errstate(divide="ignore", invalid="ignore"):
            a = np.abs(v)
            fin = np.isfinite(v) & (a > 0)
            x, sig, sure = _scaled(np.where(fin, a, 1.0))
        sure &= fin
        _plain_decimal(x, sig, out)
        out[~sure] = 0
        out[(v == 0), 1] = _DIGIT0
        out[:, 0] = (np.signbit(v) & (sure | (v == 0))) * _MINUS
        rest = np.flatnonzero(~sure & (v != 0) & ~np.isnan(v))
        if len(rest):  # inf, exponent notation, near-ties: Python's own %.9g
            other = _text_matrix(["%.9g" % f for f in v[rest].tolist()])  # noqa: UP031
            out[rest, : other.shape[1]] = other

    return _FLOAT_WIDTH, fill


def _str_cells(col: np.ndarray) -> tuple[int, Fill]:
    """Each value's ``str``, quoted as csv does; few distinct values (a status, a reject
    reason), so each is quoted and encoded once."""
    vals = [str(v) for v in col.tolist()]
    distinct = list(dict.fromkeys(vals))
    if any("\0" in s for s in distinct):
        raise ValueError("a string cell holds a NUL character")
    index = {s: i for i, s in enumerate(distinct)}
    table = _text_matrix([_quote(s) for s in distinct])
    return _copied(table[np.fromiter(map(index.__getitem__, vals), np.intp, len(vals))])


def _cells(col: np.ndarray) -> tuple[int, Fill]:
    """A column's cells: their width in bytes, and the fill that writes them into an
    (n, width) view of the chunk's byte matrix (unused bytes left NUL)."""
    if col.dtype.kind == "f":
        return _float_cells(col)
    if col.dtype.kind in "iu":
        return _int_cells(col)
    return _str_cells(col)


def format_rows(columns: dict[str, np.ndarray], start: int, stop: int) -> bytes:
    """Rows ``start:stop`` of ``columns`` as CSV bytes (each row ends with a line break)."""
    if stop <= start:
        return b""
    cells = [_cells(np.asarray(col[start:stop])) for col in columns.values()]
    out = np.zeros((stop - start, sum(w for w, _ in cells) + len(cells)), np.uint8)
    pos = 0
    for width, fill in cells:
        fill(out[:, pos : pos + width])
        out[:, pos + width] = ord(",")
        pos += width + 1
    out[:, -1] = ord("\n")
    return out.tobytes().translate(None, b"\0")


def write_csv(path, columns: dict[str, np.ndarray], header: bool = True) -> None:
    """Write ``columns`` (equal-length arrays, in order) to ``path`` in chunks of rows."""
    n = len(next(iter(columns.values()))) if columns else 0
    with open(path, "wb") as f:
        if header:
            f.write((",".join(_quote(k) for k in columns) + "\n").encode())
        for start in range(0, n, CHUNK_ROWS):
            f.write(format_rows(columns, start, min(start + CHUNK_ROWS, n)))
