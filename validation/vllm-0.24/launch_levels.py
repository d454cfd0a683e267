"""A served pair's moderate and heavy cases simulated at its table's fastest, median and slowest
engine process's launch level (CPU, ~1 min a pair):

    python validation/vllm-0.24/launch_levels.py h100/deepseek-v2-lite

Why: a table charges its engine processes' median launch level, and a serving run is one more
draw (`latency.launch_scale`, `EngineStepModel.scale_launches`). This prints how far the
predicted TTFT and TPOT move across the draws the table itself saw, on the experiment's
scheduled arrivals (not the replay's submissions: nothing here is compared with a replay). A
pair whose table has one engine process is refused by the option, by name.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from run_all import PAIRS, case_overrides, cases  # noqa: E402

from profiles import engine_jobs  # noqa: E402
from simulator.errors import ConfigError  # noqa: E402
from simulator.runner import build, simulate  # noqa: E402

LEVELS = ("fastest", None, "slowest")  # None: the table's own (median) level


def levels(key: str) -> list[str]:
    """One line per moderate / heavy case of the pair ``key``: TTFT p50 / p95 and TPOT p50 at
    each level of `LEVELS`."""
    pair = next(p for p in PAIRS if p.key == key)
    lines = []
    for trace, load, path in cases():
        if load == "light":
            continue
        cfg = engine_jobs.experiment(path, case_overrides(trace, load, pair))
        cells = []
        for how in LEVELS:
            c = copy.deepcopy(cfg)
            if how is not None:
                c.setdefault("latency", {})["launch_scale"] = how
            s = simulate(build(c, path, HERE)).summary
            ms = [s["ttft_s"]["p50"] * 1e3, s["ttft_s"]["p95"] * 1e3, s["tpot_s"]["p50"] * 1e3]
            cells.append(f"{ms[0]:.0f} / {ms[1]:.0f} / {ms[2]:.1f}")
        lines.append(f"| {key} | {trace}_{load} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("pairs", nargs="+", help="GPU/MODEL keys of run_all.PAIRS")
    a = ap.parse_args(argv)
    known = {p.key for p in PAIRS}
    for key in a.pairs:
        if key not in known:
            ap.error(f"{key}: not a served pair (known: {', '.join(sorted(known))})")
    print("| pair | case | TTFT p50 / p95, TPOT p50 (ms) at the fastest process's launches "
          "| at the table's | at the slowest process's |")  # fmt: skip
    print("| --- | --- | --- | --- | --- |")
    try:
        for key in a.pairs:
            print("\n".join(levels(key)), flush=True)
    except ConfigError as e:  # a table whose launches come from one engine process
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
