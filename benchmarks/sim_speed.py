"""Simulator speed: simulated requests per wall-clock second, engine-only and end to end.

Main case (``continuous``): 100,000 requests with the Azure LLM 2023 conversation trace's length
mix (rows drawn in shuffled passes, cut at Llama-3-8B's 8192-token context), Poisson arrivals at
about 80% of the engine's capacity; continuous batching, Llama-3-8B on one H200, the shipped
latency table. The other cases change one thing: ``chunked`` (chunked prefill), ``prefix``
(Qwen2.5-7B on the Mooncake conversation trace, whose prompts share prefixes, with prefix
caching), ``pd`` (P/D disaggregation, 1 prefill + 1 decode replica over NVLink). ``--replicas``
runs each case at 1, 16, 64 replicas behind round robin at the same load per replica.

Each case's capacity is measured first, by offering the same mix far above what it can serve and
reading the completion rate. Two figures per run:
* engine-only: ``simulate()`` (the event loop plus metrics), as before;
* end to end: building the workload and the run, ``simulate()``, and writing results.csv,
  steps.csv and summary.json to a temporary folder (what ``servesim run`` does).

Run:  python benchmarks/sim_speed.py [--cases continuous,chunked,prefix,pd] [--replicas 1,16,64]
          [--requests N] [--load 0.8] [--repeats 3] [--code DIR]
``--code DIR`` runs another checkout's simulator (e.g. ``git archive HEAD~1 | tar -x -C DIR``)
under this script, for an A/B in the same minutes: this VM's speed drifts by +-30%.
Figures are printed, not asserted: speed goals live here, not in timed tests.
"""

from __future__ import annotations

import argparse
import copy
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

AZURE = "workloads/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
MOONCAKE = "workloads/traces/mooncake_fast25/conversation_trace.jsonl"


def config(num_requests: int, rate: float, coalesce: bool = True) -> dict:
    """The main case (continuous batching, one replica)."""
    return {
        "name": "sim_speed",
        "seed": 0,
        "model": "llama-3-8b",
        "hardware": {"gpu": "h200", "tp": 1},
        "scheduler": {"policy": "continuous", "max_num_seqs": 256},
        "latency": {"model": "auto"},
        "workload": {
            "trace": {"path": AZURE, "repeat": True, "order": "shuffle"},
            "arrival": {"process": "poisson", "rate_per_s": rate},
            "num_requests": num_requests,
            "limits": {"max_total_tokens": 8192},
        },
        "sim": {"coalesce": coalesce},
    }


def case_config(case: str, num_requests: int, rate: float, replicas: int) -> dict:
    """``case`` at ``rate`` requests/s in total over ``replicas`` replicas (pairs for ``pd``)."""
    c = config(num_requests, rate)
    if case == "chunked":
        c["scheduler"] = {"policy": "chunked_prefill", "max_num_seqs": 256}
    elif case == "prefix":
        c["model"] = "qwen2.5-7b"
        c["scheduler"] = {"policy": "chunked_prefill", "max_num_seqs": 256}
        c["kv_cache"] = {"allocator": "paged", "prefix_caching": True}
        c["workload"]["trace"] = {"path": MOONCAKE, "repeat": True}
        c["workload"]["limits"] = {"max_total_tokens": 32768}
    elif case != "continuous" and case != "pd":
        raise SystemExit(f"unknown case {case}")
    if case == "pd":
        c["cluster"] = {
            "mode": "disaggregated", "prefill": {"replicas": replicas},
            "decode": {"replicas": replicas}, "link": "nvlink",
        }  # fmt: skip
    elif replicas > 1:
        c["cluster"] = {"replicas": replicas, "router": {"name": "round_robin"}}
    return c


def capacity(case: str, api) -> float:
    """Completion rate of one replica (or P/D pair) offered far more than it can serve."""
    build, simulate, _ = api
    probe = simulate(build(case_config(case, 5000, 1000.0, 1), "sim_speed", REPO))
    return probe.summary["throughput"]["requests_per_s"]


def timed_run(cfg: dict, api) -> dict:
    """One end-to-end run; wall times of its phases."""
    build, simulate, write_results = api
    t0 = time.perf_counter()
    built = build(copy.deepcopy(cfg), "sim_speed", REPO)
    t1 = time.perf_counter()
    res = simulate(built)
    t2 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        write_results(Path(out), res)
    t3 = time.perf_counter()
    return {"build": t1 - t0, "engine": t2 - t1, "write": t3 - t2, "e2e": t3 - t0,
            "summary": res.summary}  # fmt: skip


def median(xs):
    return sorted(xs)[len(xs) // 2]


DEFAULT_REQUESTS = {"continuous": 100_000, "chunked": 100_000, "prefix": 10_000, "pd": 30_000}


def run_case(case: str, replicas: int, args, api, cap: float) -> dict:
    rate = args.load * cap * replicas
    cfg = case_config(case, args.requests or DEFAULT_REQUESTS[case], rate, replicas)
    runs = [timed_run(cfg, api) for _ in range(args.repeats)]
    s = runs[-1]["summary"]
    n = s["requests"]["arrived"]
    row = {"case": case, "replicas": replicas, "requests": n, "rate": rate,
           "steps": s["utilization"]["num_steps"]}  # fmt: skip
    for k in ("build", "engine", "write", "e2e"):
        row[k] = median([r[k] for r in runs])
        row[k + "_all"] = [r[k] for r in runs]
    row["engine_rps"] = n / row["engine"]
    row["e2e_rps"] = n / row["e2e"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="continuous", help="comma-separated: continuous, "
                    "chunked, prefix, pd (default continuous)")  # fmt: skip
    ap.add_argument("--replicas", default="1", help="comma-separated counts (e.g. 1,16,64)")
    ap.add_argument("--requests", type=int, help="requests per run, all replicas together "
                    "(default: 100,000; 10,000 for prefix, 30,000 for pd)")  # fmt: skip
    ap.add_argument("--load", type=float, default=0.8, help="fraction of each replica's capacity")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs (wall time varies)")
    ap.add_argument("--code", help="checkout whose simulator to time (default: this one)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.code).resolve() if args.code else REPO))
    from simulator.results import write_results
    from simulator.runner import build, simulate

    api = (build, simulate, write_results)
    print(f"code: {args.code or REPO}; load {args.load:.0%}, median of {args.repeats}")
    hdr = (f"{'case':<11}{'reps':>5}{'cap/rep':>9}{'steps':>10}{'engine s':>10}{'engine r/s':>12}"
           f"{'e2e s':>8}{'e2e r/s':>10}{'build':>7}{'write':>7}{'x per req':>10}")  # fmt: skip
    print(hdr)
    for case in args.cases.split(","):
        cap = capacity(case, api)
        base = None
        for reps in [int(r) for r in args.replicas.split(",")]:
            row = run_case(case, reps, args, api, cap)
            base = base or row
            slow = base["engine_rps"] / row["engine_rps"]
            print(f"{case:<11}{reps:>5}{cap:>9.2f}{row['steps']:>10}{row['engine']:>10.2f}"
                  f"{row['engine_rps']:>12,.0f}{row['e2e']:>8.2f}{row['e2e_rps']:>10,.0f}"
                  f"{row['build']:>7.2f}{row['write']:>7.2f}{slow:>10.2f}", flush=True)  # fmt: skip
            print(
                f"{'':<16}engine runs {', '.join(f'{w:.2f}' for w in row['engine_all'])}; "
                f"e2e runs {', '.join(f'{w:.2f}' for w in row['e2e_all'])}",
                flush=True,
            )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"peak RSS of this process {rss:.0f} MiB ('x per req': engine time per request "
        "relative to the case's first replica count)"
    )


if __name__ == "__main__":
    main()
