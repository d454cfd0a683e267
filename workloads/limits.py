"""Limits on a workload, and an exact account of what each one cut.

Why a count per reason: a run whose requests were silently dropped reports a load it never
applied. Every request removed here is counted in ``cuts[reason]`` (``Workload.cuts``).

Limits apply in a fixed order, and a request is counted under the first limit that removes it:

1. ``duration_s``: arrivals after this time (an arrival exactly at it is kept);
2. ``max_total_tokens``: prompt + output tokens above this (e.g. the model's max length);
3. ``max_requests``: all but the first ``max_requests`` survivors, in arrival order.

Every limit that is set appears in the returned cuts, with 0 when it removed nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.cfg import Section


@dataclass(frozen=True)
class Limits:
    """None means no limit."""

    max_requests: int | None = None
    duration_s: float | None = None
    max_total_tokens: int | None = None

    def describe(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def parse_limits(sec: Section) -> Limits:
    """Read ``workload.limits`` (absent = no limits)."""
    out = Limits(
        max_requests=sec.int("max_requests", None, min=1),
        duration_s=sec.num("duration_s", None, min=0, strict_min=True),
        max_total_tokens=sec.int("max_total_tokens", None, min=2),
    )
    sec.done()
    return out


def apply_limits(
    limits: Limits, arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray
) -> tuple[np.ndarray, dict[str, int]]:
    """Indices of the requests that pass every limit (in order), and the cut counts by reason.

    ``arrival_s`` must be non-decreasing.
    """
    keep = np.ones(len(arrival_s), dtype=bool)
    cuts: dict[str, int] = {}
    if limits.duration_s is not None:
        late = keep & (arrival_s > limits.duration_s)
        cuts["duration_s"] = int(late.sum())
        keep &= ~late
    if limits.max_total_tokens is not None:
        long = keep & (prompt + output > limits.max_total_tokens)
        cuts["max_total_tokens"] = int(long.sum())
        keep &= ~long
    index = np.flatnonzero(keep)
    if limits.max_requests is not None:
        cuts["max_requests"] = max(0, len(index) - limits.max_requests)
        index = index[: limits.max_requests]
    return index, cuts
