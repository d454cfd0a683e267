"""One replica's record of its engine steps, kept compact.

Why: a long run has millions of steps. A Python tuple of 11 numbers costs ~300 bytes; the same
row as float64 costs 88. The replica appends tuples to a short list (the cheapest thing to do in
its hot loop) and every ``chunk`` rows the list is packed into one float64 array.

Invariants: rows are kept in append order; every value is stored as float64, exactly as
``np.array(rows, dtype=float)`` stores it (each value through ``float()``; integers are exact
below 2**53), so the arrays ``metrics.step_arrays`` builds are the ones it built from a list of
tuples (`float64_rows` says why its fast path gives those values). ``log[i]`` and iteration
give rows back as tuples of floats.
"""

from __future__ import annotations

import struct
from array import array
from itertools import chain, starmap

import numpy as np

NAMES = (
    "start_s", "duration_s", "prefill_tokens", "prefill_attn", "prefill_seqs", "decode_seqs",
    "decode_ctx", "kv_blocks_used", "num_waiting", "num_running", "kv_tokens",
)  # fmt: skip
WIDTH = len(NAMES)
#: the columns that hold floats in a plain run's rows (`float64_rows`); every other one ints
FLOAT_COLUMNS = (NAMES.index("start_s"), NAMES.index("duration_s"), NAMES.index("prefill_attn"))
#: one row of those types as native doubles and long longs (`float64_rows`)
_ROW = struct.Struct("".join("d" if j in FLOAT_COLUMNS else "q" for j in range(WIDTH)))
#: rows per packed chunk of a lone replica. Small enough that tuples are packed while still in
#: cache and few are alive at once: with 64 replicas 8192 meant nearly every row (each replica has
#: ~5.6k of a 100k-request run) stayed a live tuple until the run's end, packed cold in one go
CHUNK = 1024
#: pending rows of all the replicas of a run together (see `chunk_rows` and `pack_together`)
CLUSTER_PENDING = 1024
#: fewest rows per replica before its group is packed
MIN_CHUNK = 8


def chunk_rows(num_replicas: int) -> int:
    """Rows a replica appends before the steps of ``num_replicas`` replicas simulated together
    (sharing their packing) are packed.

    Why: the replicas' steps interleave, so what is alive between packs is the sum over the
    replicas. Bounding that sum (`CLUSTER_PENDING` rows, ~0.3 MB of tuples) keeps the packed
    tuples and the memory they free in the cache. Results do not depend on it (packing keeps
    every value)."""
    return max(MIN_CHUNK, min(CHUNK, CLUSTER_PENDING // max(1, num_replicas)))


def share_packing(logs: list[StepLog]) -> None:
    """Make ``logs`` (the replicas of one run) pack together: see `pack_together`."""
    for log in logs:
        log.group = logs


def float64_rows(groups: list[list[tuple]], n: int) -> np.ndarray:
    """The ``n`` rows of ``groups`` (lists of tuples of `WIDTH` Python numbers, one after the
    other) as an (n, WIDTH) float64 array: exactly ``np.fromiter``'s values (``float()`` of
    each, as ``np.array(rows, dtype=float)``).

    Why: numpy's per-item conversion turns every Python int into a float object first (an
    allocation and a free, ~35 ns a value in a run, ~5% of one), and most of a row's values
    are ints (counts, context sums, block counts). A plain run's rows hold floats in
    `FLOAT_COLUMNS` and ints elsewhere, so each row is packed by one ``struct`` call (`_ROW`:
    ``q`` stores an int as int64 with no object made, ``d`` a float's double bit for bit),
    and numpy casts the int columns to float64: round to nearest even, as ``float()`` of an
    int does (exact below 2**53). Rows of other types (a float where an int is expected, as
    sliding-window runs have, an int past int64, anything ``q`` refuses) raise
    ``struct.error``, and then all go through ``np.fromiter`` as before; an int in a float
    column is ``d``'s ``float()`` of it. Half the time of ``fromiter`` for 1,024 rows. The
    groups are read in place (no list of all the rows is built). ``out`` is allocated before
    the packed bytes: the chunk that is kept then takes the hole the last pack's bytes left,
    and the bytes (freed at once) lie above it; in the other order kept chunks and holes
    alternated (peak RSS of a 1M-request run 1,022 against 924 MiB)."""
    out = np.empty((n, WIDTH))
    try:
        packed = b"".join(starmap(_ROW.pack, chain.from_iterable(groups)))
    except struct.error:
        flat = np.fromiter(chain.from_iterable(chain.from_iterable(groups)), float, n * WIDTH)
        return flat.reshape(n, WIDTH)
    ints = np.frombuffer(packed, np.int64).reshape(n, WIDTH)
    out[...] = ints  # the cast to float64
    for j in FLOAT_COLUMNS:  # the doubles' own bits, through strided views (no copy)
        out[:, j] = ints[:, j].view(np.float64)
    return out


def pack_together(logs: list[StepLog]) -> None:
    """Pack the pending tuples of all ``logs`` at once (`float64_rows`); each log keeps a view
    of its own rows, in order. Why: a cluster's replicas step in turn, so one replica's chunk
    fills over the whole cluster's last steps; with 64 replicas packing each replica's 64 rows
    on its own meant tuples gone cold and ~5.5k packs a run (0.25 s, against 0.085 s at one
    replica). Packed together every `CLUSTER_PENDING` rows of the cluster (one replica's
    `chunk_rows` triggers it), the tuples are recent and the packs ~1k (0.15 s)."""
    sizes = [len(log.rows) for log in logs]
    total = sum(sizes)
    if not total:
        return
    flat = float64_rows([log.rows for log in logs], total)
    lo = 0
    for log, n in zip(logs, sizes, strict=True):
        if n:
            log._chunks.append(flat[lo : lo + n])
            log.rows.clear()
            lo += n


class StepLog:
    """``append(row)`` in the hot loop; ``array()`` for the whole (n, 11) float64 table."""

    __slots__ = ("rows", "_chunks", "append", "chunk", "group")

    def __init__(self, chunk: int = CHUNK):
        #: rows appended since the last ``pack`` (the owner packs when there are ``chunk``)
        self.rows: list[tuple] = []
        self.chunk = chunk
        self._chunks: list[np.ndarray] = []
        self.append = self.rows.append  # bound: one C call per step
        #: the logs packed together with this one (`pack_together`), or None
        self.group: list[StepLog] | None = None

    def pack(self) -> None:
        """Move the pending tuples into a float64 chunk (the owner calls it at ``chunk`` rows);
        in a group, every member's pending tuples."""
        if self.group is not None:
            pack_together(self.group)
            return
        rows = self.rows
        if rows:
            self._chunks.append(float64_rows([rows], len(rows)))
            rows.clear()

    def pack_alone(self) -> None:
        """Pack this log's rows on its own, every `CHUNK`: for a replica whose steps come in
        long stretches, not interleaved with the others' (`Replica.take_arrivals`), so that
        packing the group at `chunk_rows` would find the others' rows empty."""
        self.pack()
        self.group = None
        self.chunk = CHUNK

    def take_chunks(self) -> list[np.ndarray]:
        """The rows as float64 chunks, oldest first, leaving the log empty: the caller drops
        each chunk once copied (see metrics.step_arrays), so a run's steps are not held twice."""
        self.pack()
        chunks, self._chunks = self._chunks, []
        return chunks

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


#: inter-token gap pairs a replica keeps as Python objects before moving them into its arrays
GAP_CHUNK = 2048


class TokenGaps:
    """One replica's inter-token gaps: (gap seconds, how many tokens saw that gap) pairs, in
    the order recorded (DESIGN.md: members decoding in consecutive steps share one gap).

    The hot loop appends to two lists through their bound appends (``gap``, ``count``); the
    replica moves them into a raw-double and an int64 array (`pack`) once `GAP_CHUNK` are
    pending, and every read packs first. Why: ``array('d').append`` parses each value with
    ``PyArg_Parse`` (~1.6% of a run's instructions, ~7 pairs a request), a list append stores a
    pointer; ``struct.pack`` of the list then writes the same doubles (int64s), ~5 ns a value
    (``np.fromiter`` ~10, its generic per-item conversion).
    Why arrays at all: a list keeps every gap's float alive (32 bytes against 8; a long run has
    millions of gaps), so the lists stay short.

    Invariants: the array followed by the list is every value in append order, for gaps and
    counts alike; pairs are appended whole, so the two lists have the same length between pairs.
    """

    __slots__ = ("gaps", "counts", "gap", "count", "_gap_array", "_count_array")

    def __init__(self):
        self.gaps: list[float] = []
        self.counts: list[int] = []
        self.gap = self.gaps.append  # bound: one C call a value
        self.count = self.counts.append
        self._gap_array = array("d")
        self._count_array = array("q")

    def pack(self) -> None:
        """Move the pending pairs into the arrays (the lists are cleared, never replaced)."""
        gaps, counts = self.gaps, self.counts
        if gaps:  # native doubles / long longs, as the arrays hold them
            self._gap_array.frombytes(struct.pack(f"{len(gaps)}d", *gaps))
            gaps.clear()
        if counts:
            self._count_array.frombytes(struct.pack(f"{len(counts)}q", *counts))
            counts.clear()

    def gap_array(self) -> array:
        """Every gap so far, as raw doubles (``array('d')``)."""
        self.pack()
        return self._gap_array

    def count_array(self) -> array:
        """Every count so far, as int64s (``array('q')``)."""
        self.pack()
        return self._count_array
