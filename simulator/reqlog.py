"""Per-request records kept as columns while the run goes on.

Why: a `Request` object with its floats costs ~500 bytes, and the runner used to keep every one
until the end to build ``requests.csv``. The log keeps only requests still in the system; once a
request is finished or rejected its facts never change, so a sweep copies them into preallocated
numpy columns and lets the object go (~70 bytes a request).

Invariants: request ids are arrival indices, and when `table` is called the ``n`` requests
logged are ids ``0..n-1`` (the cluster numbers them so; replicas that take their own arrivals,
`cluster.OwnArrivals`, log them out of id order in between); every
arrived request is in ``_live`` or has been stored, never both; a stored request was FINISHED
or REJECTED when stored. Sweeps run when ``_live`` has doubled since the last one, so their cost
is amortized O(1) a request. `table()` gives exactly the columns `metrics.request_table` gives
for the list of the same requests (tests/test_streaming.py).
"""

from __future__ import annotations

import struct

import numpy as np

from simulator.metrics import derived_request_columns
from simulator.request import FINISHED, Request, Status

_STATUS_NAMES = np.array([s.name.lower() for s in Status], dtype=object)
_FLOATS = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s")
_INTS = ("input_tokens", "output_tokens", "generated_tokens", "preemptions", "cached_tokens",
         "replica")  # fmt: skip


def _int64s(values: list[int]) -> np.ndarray:
    """``values`` as int64, the values ``np.array(values, dtype=np.int64)`` holds: ``struct``
    packs each int as a native long long (~5 ns a value; numpy's list conversion ~20)."""
    return np.frombuffer(struct.pack(f"{len(values)}q", *values), np.int64)


def _doubles(values: list[float]) -> np.ndarray:
    """``values`` (numbers, no None) as float64, the same doubles, as `_int64s` does it."""
    return np.frombuffer(struct.pack(f"{len(values)}d", *values), np.float64)


class RequestLog:
    def __init__(self, capacity: int):
        self.num_arrived = 0
        self._live: dict[int, Request] = {}
        self._sweep_at = 1024
        self._cols = {k: np.full(capacity, np.nan) for k in _FLOATS}
        self._cols.update({k: np.zeros(capacity, dtype=np.int64) for k in _INTS})
        self._status = np.zeros(capacity, dtype=np.int8)
        self._reasons: dict[int, str] = {}

    def add(self, req: Request) -> None:
        """Record an arrival (by the time of `table`, ids ``0..n-1`` must have been added)."""
        self._live[req.id] = req
        self.num_arrived += 1
        if len(self._live) >= self._sweep_at:
            self._sweep()

    def _sweep(self) -> None:
        done = [r for r in self._live.values() if r.status >= FINISHED]
        self._store(done)
        live = self._live
        for r in done:
            del live[r.id]
        self._sweep_at = max(1024, 2 * len(live))

    def _store(self, reqs: list[Request]) -> None:
        """Copy the facts of ``reqs`` into the columns at their ids."""
        if not reqs:
            return
        n = len(reqs)
        ids = _int64s([r.id for r in reqs])
        c = self._cols
        # `fromiter` of a list: what `np.array(list, dtype=float)` gives (None -> NaN, by the
        # same per-item setter) without its dtype and shape discovery, ~3x faster here
        c["arrival_s"][ids] = _doubles([r.arrival_s for r in reqs])  # never None
        c["first_scheduled_s"][ids] = np.fromiter([r.first_scheduled_s for r in reqs], float, n)
        c["first_token_s"][ids] = np.fromiter([r.first_token_s for r in reqs], float, n)
        c["finish_s"][ids] = np.fromiter([r.finish_s for r in reqs], float, n)
        c["input_tokens"][ids] = _int64s([r.num_prompt_tokens for r in reqs])
        c["output_tokens"][ids] = _int64s([r.max_output_tokens for r in reqs])
        c["generated_tokens"][ids] = _int64s([r.num_output for r in reqs])
        c["preemptions"][ids] = _int64s([r.num_preemptions for r in reqs])
        c["cached_tokens"][ids] = _int64s([r.num_cached_tokens for r in reqs])
        c["replica"][ids] = _int64s([-1 if r.replica is None else r.replica for r in reqs])
        self._status[ids] = np.fromiter([r.status for r in reqs], np.int8, n)
        for r in reqs:
            if r.reject_reason:
                self._reasons[r.id] = r.reject_reason

    def table(self, output_delay_s: float = 0.0) -> dict[str, np.ndarray]:
        """The columns of `metrics.request_table` for every arrived request, in id order
        (``output_delay_s``: `metrics.derived_request_columns`).

        Stores the requests still in the system as they are now (call it once, at the end).
        """
        self._store(list(self._live.values()))
        self._live = {}
        n = self.num_arrived
        cols = {"id": np.arange(n, dtype=np.int64)}
        for k in ("arrival_s", "input_tokens", "output_tokens", "generated_tokens",
                  "first_scheduled_s", "first_token_s", "finish_s", "preemptions",
                  "cached_tokens", "replica"):  # fmt: skip
            cols[k] = self._cols.pop(k)[:n].copy()
        status = _STATUS_NAMES[self._status[:n]]
        reason = np.full(n, "", dtype=object)
        for i, text in self._reasons.items():
            reason[i] = text
        return derived_request_columns(cols, status, reason, output_delay_s)
