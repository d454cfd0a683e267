"""A tiny experiment config for the tooling tests (sweep, plots, compare, regress, timeline)."""

from __future__ import annotations

import copy

TINY = {
    "name": "tiny",
    "model": "llama-3-8b",
    "hardware": {"gpu": "h200"},
    "scheduler": {"policy": "continuous"},
    "latency": {"model": "roofline"},
    "workload": {
        "arrival": {"process": "poisson", "rate_per_s": 4.0},
        "lengths": {
            "input": {"dist": "uniform", "low": 16, "high": 256},
            "output": {"dist": "uniform", "low": 2, "high": 64},
        },
        "num_requests": 40,
    },
    "slo": {"ttft_ms": 200, "tpot_ms": 20},
}


def tiny(**top) -> dict:
    """A copy of TINY with top-level keys replaced or added."""
    cfg = copy.deepcopy(TINY)
    cfg.update(copy.deepcopy(top))
    return cfg
