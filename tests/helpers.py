"""Small builders shared by the tests: a one-replica engine driven directly, no YAML."""

from __future__ import annotations

import simpy

from policies import POLICIES
from policies.routing import RoundRobin
from simulator.cfg import Section
from simulator.cluster import Cluster
from simulator.executor import SimulatedExecutor
from simulator.kv.paged import PagedAllocator
from simulator.latency.constant import ConstantLatencyModel
from simulator.metrics import request_table
from simulator.replica import Replica
from workloads.spec import RequestSpec


class LinearLatency:
    """step = a + b*prefill_tokens + c*decode_seqs + d*decode_ctx (hand-computable, monotone)."""

    name = "linear"

    def __init__(self, a=1e-3, b=1e-5, c=2e-5, d=1e-8):
        self.a, self.b, self.c, self.d = a, b, c, d

    def step_time(self, pt, pa, ps, ds, dctx):
        return self.a + self.b * pt + self.c * ds + self.d * dctx

    def describe(self):
        return {"name": self.name, "warnings": []}


def run_engine(
    specs,
    *,
    policy="continuous",
    params=None,
    latency=None,
    num_blocks=10_000,
    block_size=16,
    max_model_len=8192,
    coalesce=True,
    replicas=1,
    until=None,
):
    """Run ``specs`` (RequestSpec list) through ``replicas`` engines; return (cols, replicas)."""
    env = simpy.Environment()
    cluster = Cluster(env, list(specs), RoundRobin(Section({}, "test")))
    engine = {"max_model_len": max_model_len, "block_size": block_size, "num_blocks": num_blocks}
    latency = latency or ConstantLatencyModel(0.01)
    reps = []
    for i in range(replicas):
        pol = POLICIES[policy](Section(dict(params or {}), "test", "scheduler"), engine)
        rep = Replica(
            env, i, pol, PagedAllocator(num_blocks, block_size), SimulatedExecutor(latency),
            coalesce=coalesce,
        )  # fmt: skip
        cluster.add_replica(rep)
        reps.append(rep)
    cluster.start()
    env.run(until=until)
    if until is not None:
        for rep in reps:
            rep.sync()
    return request_table(cluster.requests), reps


def spec(arrival, prompt, output, hash_ids=None):
    return RequestSpec(float(arrival), int(prompt), int(output), hash_ids)
