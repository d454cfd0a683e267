"""One replica's record of its engine steps, kept compact.

Why: a long run has millions of steps. A Python tuple of 11 numbers costs ~300 bytes; the same
row as float64 costs 88. The replica appends tuples to a short list (the cheapest thing to do in
its hot loop) and every ``CHUNK`` rows the list is packed into one float64 array.

Invariants: rows are kept in append order; every value is stored as float64, exactly as
``np.array(rows, dtype=float)`` stores it (each value through ``float()``; integers are exact
below 2**53), so the arrays ``metrics.step_arrays`` builds are the ones it built from a list of
tuples. ``log[i]`` and iteration give rows back as tuples of floats.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

NAMES = (
    "start_s", "duration_s", "prefill_tokens", "prefill_attn", "prefill_seqs", "decode_seqs",
    "decode_ctx", "kv_blocks_used", "num_waiting", "num_running", "kv_tokens",
)  # fmt: skip
WIDTH = len(NAMES)
#: rows per packed chunk. Small enough that tuples are packed while still in cache and few are
#: alive at once: with 64 replicas 8192 meant nearly every row (each replica has ~5.6k of a
#: 100k-request run) stayed a live tuple until the run's end, packed cold in one go
CHUNK = 1024


class StepLog:
    """``append(row)`` in the hot loop; ``array()`` for the whole (n, 11) float64 table."""

    __slots__ = ("rows", "_chunks", "append")

    def __init__(self):
        #: rows appended since the last ``pack`` (the owner packs when there are ``CHUNK``)
        self.rows: list[tuple] = []
        self._chunks: list[np.ndarray] = []
        self.append = self.rows.append  # bound: one C call per step

    def pack(self) -> None:
        """Move the pending tuples into a float64 chunk (call when ``pending() >= CHUNK``)."""
        rows = self.rows
        if rows:
            flat = np.fromiter(chain.from_iterable(rows), dtype=float, count=len(rows) * WIDTH)
            self._chunks.append(flat.reshape(-1, WIDTH))
            rows.clear()

    def drain(self):
        """Yield the rows as float64 chunks, oldest first, letting each go once yielded (the
        run's columns are being copied out; see metrics.step_arrays). Leaves the log empty."""
        self.pack()
        chunks, self._chunks = self._chunks, []
        chunks.reverse()
        while chunks:
            yield chunks.pop()

    def array(self) -> np.ndarray:
        """All rows as one (n, 11) float64 array (packs the pending tuples first)."""
        self.pack()
        if not self._chunks:
            return np.zeros((0, WIDTH))
        if len(self._chunks) > 1:
            self._chunks = [np.concatenate(self._chunks)]
        return self._chunks[0]

    def __len__(self) -> int:
        return sum(len(c) for c in self._chunks) + len(self.rows)

    def __getitem__(self, i: int) -> tuple:
        return tuple(self.array()[i].tolist())

    def __iter__(self):
        return iter(map(tuple, self.array().tolist()))

    def __array__(self, dtype=None, copy=None):
        a = self.array()
        return a if dtype is None else a.astype(dtype)
