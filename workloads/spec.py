"""What a workload hands to the simulator."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np


class RequestSpec(NamedTuple):
    """One request as it arrives. ``hash_ids`` are prefix-block ids (Mooncake style) or None."""

    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    hash_ids: tuple[int, ...] | None = None


class RequestColumns(Sequence):
    """The requests of a workload as columns: a read-only sequence of `RequestSpec`.

    Why: a list of 10 million named tuples takes ~1.6 GB; three arrays take 240 MB. Items and
    iteration give `RequestSpec` rows with Python ``float``/``int`` values, equal to the ones the
    list held, so consumers that read rows are unchanged; the simulator's hot paths read the
    arrays. Invariant: all columns have the same length; ``hash_ids`` is None or a list.
    """

    _ITER_CHUNK = 65536

    def __init__(self, arrival_s, num_prompt_tokens, num_output_tokens, hash_ids=None):
        self.arrival_s = np.asarray(arrival_s, dtype=float)
        self.num_prompt_tokens = np.asarray(num_prompt_tokens, dtype=np.int64)
        self.num_output_tokens = np.asarray(num_output_tokens, dtype=np.int64)
        self.hash_ids = hash_ids
        n = len(self.arrival_s)
        if (
            len(self.num_prompt_tokens) != n
            or len(self.num_output_tokens) != n
            or (hash_ids is not None and len(hash_ids) != n)
        ):
            raise ValueError("request columns of different lengths")

    @classmethod
    def of(cls, requests) -> RequestColumns:
        """``requests`` as columns (itself when it already is)."""
        if isinstance(requests, cls):
            return requests
        rows = list(requests)
        hashes = [r.hash_ids for r in rows]
        return cls(
            [r.arrival_s for r in rows], [r.num_prompt_tokens for r in rows],
            [r.num_output_tokens for r in rows],
            None if all(h is None for h in hashes) else hashes,
        )  # fmt: skip

    def __len__(self) -> int:
        return len(self.arrival_s)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return list(self)[i]
        h = self.hash_ids[i] if self.hash_ids is not None else None
        return RequestSpec(
            float(self.arrival_s[i]), int(self.num_prompt_tokens[i]),
            int(self.num_output_tokens[i]), h,
        )  # fmt: skip

    def __iter__(self):
        return map(RequestSpec._make, self.rows())

    def rows(self):
        """Plain ``(arrival_s, num_prompt_tokens, num_output_tokens, hash_ids)`` tuples, made a
        chunk at a time (the simulator's arrival loop; no named tuple per request)."""
        n, step = len(self), self._ITER_CHUNK
        for lo in range(0, n, step):
            hi = min(lo + step, n)
            hashes = self.hash_ids[lo:hi] if self.hash_ids is not None else [None] * (hi - lo)
            yield from zip(
                self.arrival_s[lo:hi].tolist(), self.num_prompt_tokens[lo:hi].tolist(),
                self.num_output_tokens[lo:hi].tolist(), hashes, strict=True,
            )  # fmt: skip

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sequence) or len(other) != len(self):
            return False
        return list(self) == list(other)

    __hash__ = None

    def __repr__(self) -> str:
        return f"RequestColumns({len(self)} requests)"


@dataclass
class Workload:
    """Requests sorted by arrival, plus an account of what the limits cut and why.

    ``cuts`` maps a reason (e.g. "max_requests", "duration_s", "max_total_tokens") to the number of
    requests of the source that were not used for that reason. Nothing is dropped silently.
    ``requests`` is a `RequestColumns` when built from a config (any sequence of `RequestSpec`
    is accepted by the simulator).
    """

    requests: Sequence[RequestSpec]
    source: str
    cuts: dict[str, int] = field(default_factory=dict)
    # info for summary.json: e.g. {"arrival": "poisson", "rate_per_s": 5.0, "trace": "..."}
    info: dict = field(default_factory=dict)
    #: the random streams (``workloads.build.STREAMS``) the build drew from; empty for a trace
    #: replayed as recorded, whose requests then do not depend on the seed
    random_draws: tuple[str, ...] = ()
