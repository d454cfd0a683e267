"""What a workload hands to the simulator."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class RequestSpec(NamedTuple):
    """One request as it arrives. ``hash_ids`` are prefix-block ids (Mooncake style) or None."""

    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    hash_ids: tuple[int, ...] | None = None


@dataclass
class Workload:
    """Requests sorted by arrival, plus an account of what the limits cut and why.

    ``cuts`` maps a reason (e.g. "max_requests", "duration_s", "max_total_tokens") to the number of
    requests of the source that were not used for that reason. Nothing is dropped silently.
    """

    requests: list[RequestSpec]
    source: str
    cuts: dict[str, int] = field(default_factory=dict)
    # info for summary.json: e.g. {"arrival": "poisson", "rate_per_s": 5.0, "trace": "..."}
    info: dict = field(default_factory=dict)
    #: the random streams (``workloads.build.STREAMS``) the build drew from; empty for a trace
    #: replayed as recorded, whose requests then do not depend on the seed
    random_draws: tuple[str, ...] = ()
