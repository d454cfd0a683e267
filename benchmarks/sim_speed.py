"""Simulator speed: simulated requests per wall-clock second.

Workload: 100,000 requests with the Azure LLM 2023 conversation trace's length mix (rows drawn in
shuffled passes, cut at Llama-3-8B's 8192-token context), Poisson arrivals at about 80% of the
engine's capacity. Engine: continuous batching, Llama-3-8B on one H200, the shipped latency
table (or the roofline model if none).

Capacity is measured first, by offering the same mix far above what the engine can serve and
reading the completion rate. Run:  python benchmarks/sim_speed.py [--requests N] [--load 0.8]
Figures are printed, not asserted: speed goals live here, not in timed tests.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from simulator.runner import build, simulate  # noqa: E402


def config(num_requests: int, rate: float, coalesce: bool = True) -> dict:
    return {
        "name": "sim_speed",
        "seed": 0,
        "model": "llama-3-8b",
        "hardware": {"gpu": "h200", "tp": 1},
        "scheduler": {"policy": "continuous", "max_num_seqs": 256},
        "latency": {"model": "auto"},
        "workload": {
            "trace": {
                "path": "workloads/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
                "repeat": True,
                "order": "shuffle",
            },
            "arrival": {"process": "poisson", "rate_per_s": rate},
            "num_requests": num_requests,
            "limits": {"max_total_tokens": 8192},
        },
        "sim": {"coalesce": coalesce},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--no-coalesce", action="store_true")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs (wall time varies)")
    args = ap.parse_args()

    probe = simulate(build(config(5000, 1000.0), "sim_speed", REPO))
    capacity = probe.summary["throughput"]["requests_per_s"]
    rate = args.load * capacity
    walls = []
    for _ in range(args.repeats):
        built = build(config(args.requests, rate, not args.no_coalesce), "sim_speed", REPO)
        t0 = time.perf_counter()
        res = simulate(built)
        walls.append(time.perf_counter() - t0)
    wall = sorted(walls)[len(walls) // 2]
    s = res.summary
    steps = s["utilization"]["num_steps"]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"latency model           {s['latency_model']['name']}")
    print(f"engine capacity         {capacity:.2f} req/s (saturated probe)")
    print(f"offered load            {rate:.2f} req/s ({args.load:.0%} of capacity)")
    print(f"requests simulated      {s['requests']['arrived']} ({s['requests']['completed']} done)")
    print(f"simulated time          {s['duration_s']:.0f} s, {steps} engine steps")
    print(f"busy fraction           {s['utilization']['busy_fraction']:.2f}")
    print(f"wall time               median {wall:.2f} s of {', '.join(f'{w:.2f}' for w in walls)}")
    n = s["requests"]["arrived"]
    print(f"SPEED                   {n / wall:,.0f} simulated requests/s (median run)")
    print(f"                        {n / min(walls):,.0f} simulated requests/s (best run)")
    print(f"                        {steps / wall:,.0f} engine steps/s")
    print(f"peak RSS                {rss:.0f} MiB")


if __name__ == "__main__":
    main()
