"""One replica's record of its engine steps, kept compact.

Why: a long run has millions of steps. A Python tuple of 11 numbers costs ~300 bytes; the same
row as float64 costs 88. The replica appends tuples to a short list (the cheapest thing to do in
its hot loop) and every ``chunk`` rows the list is packed into one float64 array.

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
#: rows per packed chunk of a lone replica. Small enough that tuples are packed while still in
#: cache and few are alive at once: with 64 replicas 8192 meant nearly every row (each replica has
#: ~5.6k of a 100k-request run) stayed a live tuple until the run's end, packed cold in one go
CHUNK = 1024
#: pending rows of all the replicas of a run together (see `chunk_rows`)
CLUSTER_PENDING = 4096
#: fewest rows per chunk (a pack is one numpy call, a chunk one small array)
MIN_CHUNK = 32


def chunk_rows(num_replicas: int) -> int:
    """Rows per chunk for each of ``num_replicas`` replicas simulated together.

    Why: the replicas' steps interleave, so a replica's pending tuples are packed only after
    every other replica has appended its own; what is alive between packs is the sum over the
    replicas. Bounding that sum (`CLUSTER_PENDING` rows, ~1.2 MB of tuples) keeps the packed
    tuples and the memory they free in the cache: with 1024 rows each, 64 replicas held ~19 MB
    of tuples and ran ~10% slower. Results do not depend on it (packing keeps every value)."""
    return max(MIN_CHUNK, min(CHUNK, CLUSTER_PENDING // max(1, num_replicas)))


class StepLog:
    """``append(row)`` in the hot loop; ``array()`` for the whole (n, 11) float64 table."""

    __slots__ = ("rows", "_chunks", "append", "chunk")

    def __init__(self, chunk: int = CHUNK):
        #: rows appended since the last ``pack`` (the owner packs when there are ``chunk``)
        self.rows: list[tuple] = []
        self.chunk = chunk
        self._chunks: list[np.ndarray] = []
        self.append = self.rows.append  # bound: one C call per step

    def pack(self) -> None:
        """Move the pending tuples into a float64 chunk (the owner calls it at ``chunk`` rows)."""
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
