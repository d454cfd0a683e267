"""Builders for the policy-suite tests: engines driven directly (no YAML), and runner configs
for the effect tests (roofline Llama-3-8B on one H100, real traces, a few hundred requests)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import simpy

from policies import POLICIES
from policies.routing import ROUTERS
from simulator.cfg import Section
from simulator.cluster import Cluster
from simulator.executor import SimulatedExecutor
from simulator.kv.paged import PagedAllocator
from simulator.latency.constant import ConstantLatencyModel
from simulator.metrics import request_table
from simulator.replica import Replica
from simulator.runner import build, simulate
from workloads.spec import RequestSpec

REPO = Path(__file__).resolve().parents[1]


def spec(arrival, prompt, output, hash_ids=None):
    return RequestSpec(float(arrival), int(prompt), int(output), hash_ids)


def engine_facts(num_blocks=10_000, block_size=16, max_model_len=8192, seed=0):
    return {
        "max_model_len": max_model_len,
        "block_size": block_size,
        "num_blocks": num_blocks,
        "kv_bytes_per_token_per_gpu": 131072.0,
        "kv_bytes_held": lambda n: n * 131072.0,
        "rng": np.random.default_rng(seed),
    }


def make_engine(env, index, policy, params, *, latency, kv, coalesce, engine):
    pol = POLICIES[policy](Section(dict(params or {}), "test.yaml", "scheduler"), engine)
    return Replica(env, index, pol, kv, SimulatedExecutor(latency), coalesce=coalesce)


def run(
    specs,
    policy="continuous",
    params=None,
    *,
    latency=None,
    num_blocks=10_000,
    block_size=16,
    max_model_len=8192,
    coalesce=True,
    replicas=1,
    router="round_robin",
    make_kv=None,
    wrap=None,
    until=None,
):
    """Run ``specs`` through ``replicas`` engines (to the end, or to ``until`` seconds);
    return (requests, replicas, cols)."""
    env = simpy.Environment()
    latency = latency or ConstantLatencyModel(1.0)
    frontend = getattr(latency, "frontend", None)  # as simulator.runner.simulate does
    cluster = Cluster(
        env, list(specs), ROUTERS[router](Section({}, "test.yaml")),
        input_delay=frontend.input_s if frontend else None,
    )  # fmt: skip
    reps = []
    for i in range(replicas):
        engine = engine_facts(num_blocks, block_size, max_model_len, seed=i)
        kv = make_kv() if make_kv else PagedAllocator(num_blocks, block_size)
        rep = make_engine(
            env, i, policy, params, latency=latency, kv=kv, coalesce=coalesce, engine=engine
        )
        if wrap:
            wrap(rep)
        cluster.add_replica(rep)
        reps.append(rep)
    cluster.start()
    env.run(until=until)
    if until is not None:
        for rep in reps:
            rep.sync()
    return cluster.requests, reps, request_table(cluster.requests)


def by_id(requests):
    return {r.id: r for r in requests}


# ---------------------------------------------------------------- runner configs (effect tests)
MOONCAKE = "workloads/traces/mooncake_fast25/conversation_trace.jsonl"
ARXIV = "workloads/traces/vidur_processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"  # noqa: E501
AZURE_CODE = "workloads/traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv"
SHAREGPT = (
    "workloads/traces/etalon_processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"  # noqa: E501
)


def config(trace=MOONCAKE, rate=2.0, n=300, **sections):
    cfg = {
        "model": "llama-3-8b",
        "hardware": {"gpu": "h100"},
        "scheduler": {"policy": "continuous"},
        "latency": {"model": "roofline"},
        "workload": {
            "trace": {"path": trace},
            "arrival": {"process": "poisson", "rate_per_s": rate},
            "num_requests": n,
            "limits": {"max_total_tokens": 8192},
        },
    }
    for k, v in sections.items():
        cfg[k] = copy.deepcopy(v)
    return cfg


def simulate_config(cfg):
    return simulate(build(cfg, str(REPO / "test.yaml"), REPO)).summary
