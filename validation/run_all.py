"""Run every validation case and publish the sim-vs-real error (validation/README.md).

Two phases, so the GPU is held only for the real runs:

    python validation/run_all.py real --out DIR     # on the GPU: DIR/<case>/real.json.gz
    python validation/run_all.py report [--real DIR] # anywhere: reports + README summary

``real`` builds ONE StepRunner (weights, KV cache, CUDA graphs) and reuses it for every case, so
start-up and graph captures are paid once. ``report`` simulates each case with the shipped table,
compares with its saved real run and writes ``validation/<case>/report.{md,json}`` and the
summary table in ``validation/README.md`` between the ``<!-- summary -->`` markers.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from profiles import validate  # noqa: E402

#: (case, config, overrides). Light = the config's own load; heavy = near saturation for that
#: policy on this model and GPU (static/dynamic saturate near 4-5 req/s, continuous far later).
CASES = [
    ("continuous_light", "val_continuous.yaml", []),
    ("continuous_heavy", "val_continuous.yaml", ["workload.arrival.rate_per_s=24",
                                                  "workload.num_requests=150"]),
    ("chunked_prefill_light", "val_chunked_prefill.yaml", []),
    ("chunked_prefill_heavy", "val_chunked_prefill.yaml", ["workload.arrival.rate_per_s=24",
                                                            "workload.num_requests=150"]),
    ("static_light", "val_static.yaml", ["workload.arrival.rate_per_s=1"]),
    ("static_heavy", "val_static.yaml", ["workload.arrival.rate_per_s=5",
                                          "workload.num_requests=80"]),
    ("dynamic_light", "val_dynamic.yaml", ["workload.arrival.rate_per_s=1"]),
    ("dynamic_heavy", "val_dynamic.yaml", ["workload.arrival.rate_per_s=5",
                                            "workload.num_requests=80"]),
    ("contiguous_light", "val_contiguous.yaml", []),
    ("contiguous_heavy", "val_contiguous.yaml", ["workload.arrival.rate_per_s=8",
                                                  "workload.num_requests=120"]),
]  # fmt: skip


def phase_real(out: Path, only: list[str], time_mode: str) -> int:
    runner = None
    for case, cfg_name, sets in CASES:
        if only and case not in only:
            continue
        cfg, where, base = validate.prepare(str(HERE / "configs" / cfg_name), sets)
        t0 = time.perf_counter()
        real = validate.run_real(cfg, where, base, runner=runner, time_mode=time_mode)
        runner = real["runner"]
        real["case"] = case
        validate.save_real(real, out / case / "real.json.gz")
        s = real["summary"]
        print(
            f"{case}: {len(real['records']['wall_s'])} steps, busy "
            f"{sum(real['records']['wall_s']):.1f} s, wall {time.perf_counter() - t0:.1f} s, "
            f"p95 TTFT {s['ttft_s']['p95']}",
            flush=True,
        )
    return 0


def phase_report(real_dir: Path) -> int:
    rows = []
    for case, cfg_name, sets in CASES:
        src = real_dir / case / "real.json.gz"
        if not src.is_file():
            print(f"{case}: no real run at {src}; skipped")
            continue
        cfg, where, base = validate.prepare(str(HERE / "configs" / cfg_name), sets)
        real = validate.load_real(src)
        sim, latency = validate.run_sim(cfg, where, base, real, str(src))
        rep = validate.build_report(case, sim, real, latency)
        dest = HERE / case
        validate.write_report(rep, dest)
        if src.resolve() != (dest / "real.json.gz").resolve():
            shutil.copyfile(src, dest / "real.json.gz")
        rows.append(rep)
    write_summary(rows)
    return 0


def write_summary(reps: list[dict]) -> None:
    metrics = [m for m, _ in _columns()]
    head = "| case | " + " | ".join(label for _, label in _columns()) + " | median | max |"
    lines = [head, "|" + " --- |" * (len(metrics) + 3)]
    all_errs = []
    for rep in reps:
        by = {r["metric"]: r for r in rep["metrics"]}
        cells = []
        for m in metrics:
            r = by.get(m)
            if r is None:
                cells.append("n/a")
                continue
            all_errs.append(abs(r["rel_err"]))
            cells.append(f"{_v(m, r['sim'])} / {_v(m, r['real'])} ({100 * r['rel_err']:+.1f}%)")
        lines.append(
            f"| [{rep['name']}]({rep['name']}/report.md) | " + " | ".join(cells)
            + f" | {100 * rep['median_abs_rel_err']:.1f}% | {100 * rep['max_abs_rel_err']:.1f}% |"
        )  # fmt: skip
    lines += ["", "Per-step error of the table on the real runs' own batches (wall time):", "",
              "| case | steps | median abs. | p95 abs. | median signed | decode-only signed | "
              "with-prefill signed | host ms (median) |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for rep in reps:
        s = rep["steps"]
        w = s["wall"]
        k = w["by_kind"]
        lines.append(
            f"| {rep['name']} | {s['num_steps']} | {100 * w['median_abs_rel']:.1f}% | "
            f"{100 * w['p95_abs_rel']:.1f}% | {100 * w['median_rel']:+.1f}% | "
            f"{_p(k['decode_only']['median_rel'])} | {_p(k['with_prefill']['median_rel'])} | "
            f"{s['host_ms']['median']:.2f} |"
        )
    med = sorted(all_errs)[len(all_errs) // 2] if all_errs else math.nan
    lines += ["", f"Over all {len(all_errs)} metric values: median |rel. error| "
              f"{100 * med:.1f}%, max {100 * max(all_errs, default=math.nan):.1f}%."]  # fmt: skip
    readme = HERE / "README.md"
    text = readme.read_text() if readme.is_file() else "<!-- summary -->\n<!-- /summary -->\n"
    a, b = text.index("<!-- summary -->"), text.index("<!-- /summary -->")
    text = text[:a] + "<!-- summary -->\n" + "\n".join(lines) + "\n" + text[b:]
    readme.write_text(text)
    print("\n".join(lines))


def _columns():
    return [
        ("ttft_s.p50", "TTFT p50"), ("ttft_s.p95", "TTFT p95"), ("ttft_s.p99", "TTFT p99"),
        ("tpot_s.p50", "TPOT p50"), ("tpot_s.p95", "TPOT p95"), ("tpot_s.p99", "TPOT p99"),
        ("itl_s.p50", "ITL p50"), ("itl_s.p95", "ITL p95"), ("itl_s.p99", "ITL p99"),
        ("e2e_s.p50", "E2E p50"), ("e2e_s.p95", "E2E p95"), ("e2e_s.p99", "E2E p99"),
        ("throughput.requests_per_s", "req/s"), ("throughput.output_tokens_per_s", "out tok/s"),
    ]  # fmt: skip


def _v(metric: str, v: float) -> str:
    return f"{v:.2f}" if metric.startswith("throughput") else f"{1e3 * v:.1f}"


def _p(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:+.1f}%"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="phase", required=True)
    r = sub.add_parser("real")
    r.add_argument("--out", required=True)
    r.add_argument("--only", nargs="*", default=[])
    r.add_argument("--time-mode", choices=["wall", "gpu"], default="wall")
    rp = sub.add_parser("report")
    rp.add_argument("--real", default=str(HERE), help="folder holding <case>/real.json.gz")
    args = p.parse_args(argv)
    if args.phase == "real":
        return phase_real(Path(args.out), args.only, args.time_mode)
    return phase_report(Path(args.real))


if __name__ == "__main__":
    raise SystemExit(main())
