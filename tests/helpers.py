"""Small builders for the core tests: a one-replica engine driven directly, no YAML."""

from __future__ import annotations

import numpy as np

from simulator.latency.constant import ConstantLatencyModel
from tests.policy_kit import run, spec

__all__ = ["LinearLatency", "assert_same_outputs", "run_engine", "spec", "tiny_config"]


def tiny_config(
    model: str | dict, hardware: dict, latency: dict, policy: str = "continuous"
) -> dict:
    """An experiment config of 4 fixed-size requests (64 prompt, 4 output tokens, Poisson at
    5 req/s) on ``model`` with these ``hardware`` / ``latency`` sections: for tests of what a
    config resolves to (tables picked, refusals), not of its numbers."""
    sched = {"policy": policy, **({"max_num_seqs": 8} if policy == "continuous" else {})}
    return {
        "model": model,
        "hardware": hardware,
        "scheduler": sched,
        "latency": latency,
        "workload": {
            "arrival": {"process": "poisson", "rate_per_s": 5.0},
            "lengths": {
                "input": {"dist": "fixed", "value": 64},
                "output": {"dist": "fixed", "value": 4},
            },  # fmt: skip
            "num_requests": 4,
        },
    }


class LongestAwareLatency:
    """LinearLatency plus ``e * decode_max``, and it checks each call's longest context against
    the brute-force one (every decoding request's context, from the replica it is bound to)."""

    name = "longest"

    def __init__(self, e=2e-6):
        self.e = e
        self.replica = None
        self.checked = 0

    def step_time(self, pt, pa, ps, ds, dctx, dmax=0):
        return 1e-3 + 1e-5 * pt + 2e-5 * ds + 1e-8 * dctx + self.e * dmax

    def describe(self):
        return {"name": self.name, "warnings": []}


class LinearLatency:
    """step = a + b*prefill_tokens + c*decode_seqs + d*decode_ctx (hand-computable, monotone)."""

    name = "linear"

    def __init__(self, a=1e-3, b=1e-5, c=2e-5, d=1e-8):
        self.a, self.b, self.c, self.d = a, b, c, d

    def step_time(self, pt, pa, ps, ds, dctx, dmax=0):
        return self.a + self.b * pt + self.c * ds + self.d * dctx

    def describe(self):
        return {"name": self.name, "warnings": []}


def run_engine(specs, *, policy="continuous", params=None, latency=None, **kw):
    """Run ``specs`` through the engine (10 ms constant steps by default); return (cols,
    replicas). Keyword arguments as for `tests.policy_kit.run`."""
    latency = latency or ConstantLatencyModel(0.01)
    _, reps, cols = run(specs, policy, params, latency=latency, **kw)
    return cols, reps


def assert_same_outputs(cols_a: dict, reps_a: list, cols_b: dict, reps_b: list) -> None:
    """Two runs that must not differ (an optimisation's path against the plain one): every
    request column equal (NaN equal NaN in float columns), and per replica the step rows, the
    inter-token gaps with their counts, and the preemptions."""
    for k in cols_a:
        assert np.array_equal(cols_a[k], cols_b[k], equal_nan=cols_a[k].dtype.kind == "f"), k
    for x, y in zip(reps_a, reps_b, strict=True):
        assert np.array_equal(np.array(x.steps), np.array(y.steps))
        assert (x.itl_gaps, x.itl_counts) == (y.itl_gaps, y.itl_counts)
        assert x.num_preemptions == y.num_preemptions
