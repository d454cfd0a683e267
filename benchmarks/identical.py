"""Byte-identical outputs across two commits: the check every speed change must pass.

Runs a fixed set of shipped experiments (policies, allocators, preemption, P/D, routers, the
speed benchmark's round-robin clusters) on two commits, each extracted by ``git archive`` into
a fresh folder, and compares every output file (requests.csv, steps.csv, summary.json,
config.yaml) byte for byte. The only allowed difference is the checkout's own path, which the
latency table's name carries (summary.json, config.yaml): it is replaced by ``<CODE>`` in both
before comparing. timing.json (wall clock) is not compared.

Run:  python benchmarks/identical.py BASE_REV [NEW_REV]      (NEW_REV defaults to HEAD)
Exit status 0 when every file is identical; prints how many files were compared.
"""

from __future__ import annotations

import filecmp
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: (name, experiment, overrides): each a short run of one shipped experiment's configuration
RUNS = [
    ("quickstart_vllm", "quickstart.yaml", ["workload.limits.duration_s=300"]),
    ("continuous", "batching.yaml", ["scheduler.policy=continuous",
                                     "workload.arrival.rate_per_s=16",
                                     "workload.num_requests=2000"]),
    ("chunked", "chunked_prefill.yaml", ["scheduler.policy=chunked_prefill",
                                         "workload.arrival.rate_per_s=6",
                                         "workload.num_requests=1500"]),
    ("prefix", "prefix_caching.yaml", ["kv_cache.prefix_caching=true",
                                       "workload.arrival.rate_scale=0.6",
                                       "workload.num_requests=1500"]),
    ("pd_2p2d", "disaggregation.yaml", [
        "workload.arrival.rate_per_s=40", "workload.num_requests=2000",
        "cluster={mode: disaggregated, prefill: {replicas: 2}, decode: {replicas: 2}, "
        "link: nvlink}"]),
    ("preempt_recompute", "batching.yaml", ["scheduler.policy=continuous",
                                            "kv_cache.num_blocks=3000",
                                            "workload.arrival.rate_per_s=16",
                                            "workload.num_requests=1500"]),
    ("preempt_swap", "batching.yaml", ["scheduler={policy: continuous, preemption: swap}",
                                       "kv_cache.num_blocks=3000",
                                       "workload.arrival.rate_per_s=16",
                                       "workload.num_requests=1500"]),
    ("routing_rr", "routing.yaml", ["cluster.router={name: round_robin}",
                                    "workload.num_requests=800"]),
    ("routing_lo", "routing.yaml", ["cluster.router={name: least_outstanding}",
                                    "workload.num_requests=800"]),
    ("speculative", "speculative.yaml", ["scheduler.policy=speculative"]),
    ("contiguous", "paged_vs_contiguous.yaml", [
        "kv_cache={allocator: contiguous, reserve: prompt_plus_output}",
        "workload.arrival.rate_per_s=16", "workload.num_requests=1500"]),
]  # fmt: skip

#: the speed benchmark's cases (benchmarks/sim_speed.py): (case, requests, replicas)
SPEED_RUNS = [("continuous", 20000, 1), ("continuous", 20000, 16), ("continuous", 20000, 64),
              ("chunked", 20000, 64), ("pd", 5000, 1), ("prefix", 1500, 1)]  # fmt: skip

_SPEED = """
import copy, sys
from pathlib import Path
sys.path.insert(0, {bench!r})
import sim_speed as S
from simulator.runner import build, simulate
from simulator.results import write_results
case, n, reps, out = {case!r}, {n}, {reps}, Path({out!r})
cfg = S.case_config(case, n, 0.8 * 17.0 * reps, reps)
res = simulate(build(copy.deepcopy(cfg), "sim_speed", S.REPO))
write_results(out, res)
"""


def extract(rev: str, into: Path) -> None:
    tar = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True,
                         capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)


def run_all(code: Path, out: Path) -> None:
    """Every run of `RUNS` and `SPEED_RUNS` with ``code``'s simulator, outputs under ``out``."""
    for name, exp, sets in RUNS:
        cmd = [sys.executable, "-m", "simulator.cli", "run", f"experiments/{exp}", "--quiet",
               "--out", str(out / name)]  # fmt: skip
        for s in sets:
            cmd += ["--set", s]
        subprocess.run(cmd, cwd=code, check=True)
    for case, n, reps in SPEED_RUNS:
        src = _SPEED.format(bench=str(REPO / "benchmarks"), case=case, n=n, reps=reps,
                            out=str(out / f"speed_{case}_{reps}"))  # fmt: skip
        subprocess.run([sys.executable, "-c", src], cwd=code, check=True)


def compare(a: Path, b: Path, code_a: Path, code_b: Path) -> tuple[int, list[str]]:
    """Files compared and the ones that differ (paths relative to the output folders)."""
    names = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    names_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    differ = [str(n) for n in set(names) ^ set(names_b)]
    count = 0
    for rel in names:
        if rel.name == "timing.json" or rel not in names_b:
            continue
        count += 1
        fa, fb = a / rel, b / rel
        if rel.suffix in (".json", ".yaml"):
            ta = fa.read_bytes().replace(str(code_a).encode(), b"<CODE>")
            tb = fb.read_bytes().replace(str(code_b).encode(), b"<CODE>")
            same = ta == tb
        else:
            same = filecmp.cmp(fa, fb, shallow=False)
        if not same:
            differ.append(str(rel))
    return count, differ


def main() -> int:
    base, new = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "HEAD"
    with tempfile.TemporaryDirectory(prefix="identical_") as tmp:
        root = Path(tmp)
        outs = {}
        for tag, rev in (("base", base), ("new", new)):
            code = root / f"code_{tag}"
            code.mkdir()
            extract(rev, code)
            run_all(code, root / f"out_{tag}")
            outs[tag] = code
        count, differ = compare(root / "out_base", root / "out_new", outs["base"], outs["new"])
    print(f"{base} vs {new}: {count} files compared, {len(differ)} differ")
    for d in differ:
        print("  DIFFERS:", d)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
