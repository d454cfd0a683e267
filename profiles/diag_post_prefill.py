"""Does a decode step run slower right after a long prefill, and is the GPU clock why?

Why: in the three-pass H200 int4 table (`profiles/README.md`, "H200 int4 8B: decode right after
a long prefill") the first decode steps after a prefill step of 1,024+ tokens run up to 16%
slow and recover over ~8 steps, in every pass; the profiler reads energy, not clocks. This
replays the pattern with torch alone (no vLLM): a memory-bound "decode" (a 128-row bf16 GEMM
over weights of ~8 GB, read once per step) timed with CUDA events, steady, then right after a
compute-bound "prefill" burst (8,192-row GEMMs for ``--burst-ms``), while ``nvidia-smi`` logs
the SM clock and power every 10 ms. It prints, per decode step after the burst, its time over
the steady median and the SM clock nearest its start.

Run on a GPU machine: ``python -m profiles.diag_post_prefill --out DIR`` (about a minute).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import time
from pathlib import Path


def _clock_log(path: Path) -> subprocess.Popen:
    return subprocess.Popen(
        ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw",
         "--format=csv,noheader,nounits", "-lms", "10"],
        stdout=open(path, "w"),
    )  # fmt: skip


def _read_clocks(path: Path) -> list[tuple[float, float, float]]:
    """(unix time, SM MHz, W) rows of the nvidia-smi log."""
    out = []
    for row in csv.reader(open(path)):
        try:
            t = time.mktime(time.strptime(row[0].strip().split(".")[0], "%Y/%m/%d %H:%M:%S"))
            t += float("0." + row[0].strip().split(".")[1])
            out.append((t, float(row[1]), float(row[2])))
        except (IndexError, ValueError):
            continue
    return out


def run(out: Path, burst_ms: float, rounds: int, after: int) -> dict:
    import torch

    dev = torch.device("cuda")
    torch.manual_seed(0)
    # decode: 128 rows against 32 weight matrices of 4096 x 32768 bf16 (8.6 GB read per step)
    ws = [torch.randn(4096, 32768, device=dev, dtype=torch.bfloat16) for _ in range(32)]
    x = torch.randn(128, 4096, device=dev, dtype=torch.bfloat16)
    # prefill: 8192 rows against one of them (compute-bound: 2.2 TFLOP a call)
    big = torch.randn(8192, 4096, device=dev, dtype=torch.bfloat16)

    def decode():
        for w in ws:
            x @ w

    def timed_decodes(n: int) -> list[tuple[float, float]]:
        """(unix start, ms) of ``n`` back-to-back decode steps."""
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
               for _ in range(n)]  # fmt: skip
        t0 = time.time()
        for a, b in evs:
            a.record()
            decode()
            b.record()
        torch.cuda.synchronize()
        ms = [a.elapsed_time(b) for a, b in evs]
        starts = [t0 + sum(ms[:i]) / 1e3 for i in range(n)]
        return list(zip(starts, ms, strict=True))

    for _ in range(3):  # warm-up
        decode()
        big @ ws[0]
    torch.cuda.synchronize()
    log = out / "clocks.csv"
    proc = _clock_log(log)
    time.sleep(0.5)
    rec = {"steady": [], "after": []}
    for _ in range(rounds):
        rec["steady"] += timed_decodes(20)
        t_end = time.time() + burst_ms / 1e3
        while time.time() < t_end:
            big @ ws[0]
            torch.cuda.synchronize()
        rec["after"].append(timed_decodes(after))
        time.sleep(0.3)
    time.sleep(0.3)
    proc.terminate()
    clocks = _read_clocks(log)
    (out / "post_prefill.json").write_text(json.dumps({"records": rec, "clocks": clocks}))
    return summarize(rec, clocks)


def summarize(rec: dict, clocks: list) -> dict:
    steady = sorted(ms for _, ms in rec["steady"])
    base = steady[len(steady) // 2]

    def clock_at(t):
        near = min(clocks, key=lambda c: abs(c[0] - t)) if clocks else (t, float("nan"), 0.0)
        return near[1]

    steady_mhz = sorted(clock_at(t) for t, _ in rec["steady"])
    rows = []
    for i in range(len(rec["after"][0])):
        ms = sorted(r[i][1] for r in rec["after"])
        mhz = sorted(clock_at(r[i][0]) for r in rec["after"])
        rows.append({"step": i + 1, "ms_over_steady": round(ms[len(ms) // 2] / base, 4),
                     "sm_mhz": mhz[len(mhz) // 2]})  # fmt: skip
    return {"steady_ms": round(base, 3), "steady_sm_mhz": steady_mhz[len(steady_mhz) // 2],
            "after_burst": rows}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--burst-ms", type=float, default=200.0)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--after", type=int, default=12)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    print(json.dumps(run(a.out, a.burst_ms, a.rounds, a.after), indent=1))


if __name__ == "__main__":
    main()
