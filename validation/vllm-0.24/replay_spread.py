"""vLLM against itself: every stored pair of serving replays of the same arrivals, compared as
the validation compares the simulator with a replay (`profiles.replay_spread`).

    python validation/vllm-0.24/replay_spread.py            # writes spread.md beside this file
    python validation/vllm-0.24/replay_spread.py --a RUN --b RUN   # any two replays, printed

Beside each comparison it prints the simulator's own error on the reference replay (the shipped
report's ``report.json``), so the two distances read side by side. The last table leaves one
replay out at a time and predicts it by the median of the others (`oracle_table`): what no
prediction can be expected to beat, set beside the simulator on the same references.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from run_all import PAIRS, cases, error_stats, report, totals_table  # noqa: E402

from profiles.replay_spread import (  # noqa: E402
    beyond_ratio,
    compare_runs,
    leave_one_out,
    metric_values,
)
from profiles.vllm_validate import load_phase  # noqa: E402
from simulator.errors import ConfigError  # noqa: E402

MISS = 0.15


@dataclass(frozen=True)
class Repeat:
    """Two replays of one served model's cases: ``a`` the reference (the replay the shipped
    report validates on, where it is one of the two), ``b`` the other."""

    key: str  # the report's served-model key, e.g. h200/llama-3-8b
    how: str  # what differs between the two runs
    a: str  # run folders, relative to this folder
    b: str


REPEATS = (
    Repeat("h200/qwen3-30b-a3b", "same H200, minutes apart",
           "serving_repeats/h200_qwen3-30b-a3b_host2_first",
           "serving_repeats/h200_qwen3-30b-a3b_host2_second"),
    Repeat("h200/qwen3-30b-a3b", "two H200s", "real/h200_qwen3-30b-a3b",
           "serving_repeats/h200_qwen3-30b-a3b_host2_first"),
    Repeat("h200/qwen3-30b-a3b", "two H200s (a third; five cases)", "real/h200_qwen3-30b-a3b",
           "serving_repeats/h200_qwen3-30b-a3b_host3"),
    Repeat("h200/llama-3-8b", "two H200s", "real/h200_llama-3-8b",
           "serving_repeats/h200_llama-3-8b_host2"),
    Repeat("h200/qwen2.5-7b", "two H200s", "real/h200_qwen2.5-7b",
           "serving_repeats/h200_qwen2.5-7b_earlier_host"),
    Repeat("h100/llama-3-8b", "same H100, minutes apart", "real/h100_llama-3-8b",
           "serving_repeats/h100_llama-3-8b_same_host_second"),
    Repeat("h100/llama-3-8b", "two H100s", "real/h100_llama-3-8b",
           "serving_repeats/h100_llama-3-8b_earlier_host"),
    Repeat("h100/llama-3-8b", "two H100s (a third)", "real/h100_llama-3-8b",
           "h100_llama-3-8b_3pass/real/h100_llama-3-8b"),
    Repeat("h100/qwen2.5-7b", "two H100s", "real/h100_qwen2.5-7b",
           "serving_repeats/h100_qwen2.5-7b_earlier_host"),
    Repeat("h100/qwen2.5-7b", "same H100, minutes apart", "real/h100_qwen2.5-7b",
           "serving_repeats/h100_qwen2.5-7b_same_host_second"),
    Repeat("h100/qwen2.5-7b", "two H100s (the earlier table's)", "real/h100_qwen2.5-7b",
           "serving_repeats/h100_qwen2.5-7b_host2"),
    Repeat("h200/qwen3-30b-a3b-tp2", "two 2x H200 hosts (five cases)",
           "real/h200_qwen3-30b-a3b_tp2", "serving_repeats/h200_qwen3-30b-a3b_tp2_host2"),
    Repeat("h100/deepseek-v2-lite", "two H100s", "real/h100_deepseek-v2-lite",
           "serving_repeats/h100_deepseek-v2-lite_host2"),
    Repeat("h100/deepseek-v2-lite", "two H100s (the earlier table's)",
           "real/h100_deepseek-v2-lite", "serving_repeats/h100_deepseek-v2-lite_host3"),
    Repeat("h200/llama-3-8b", "two H200s (a third)", "real/h200_llama-3-8b",
           "serving_repeats/h200_llama-3-8b_host4"),
    Repeat("h200/llama-3-8b-int4", "two H200s (the table's and another)",
           "real/h200_llama-3-8b-int4", "serving_repeats/h200_llama-3-8b-int4_host2"),
    Repeat("h200/llama-3-8b-int4", "two H200s (the table's and a third)",
           "real/h200_llama-3-8b-int4", "serving_repeats/h200_llama-3-8b-int4_host3"),
    Repeat("h200/qwen2.5-7b", "two H200s (a third)", "real/h200_qwen2.5-7b",
           "serving_repeats/h200_qwen2.5-7b_host3"),
    Repeat("h200/qwen2.5-7b", "two H200s (the earlier table's)", "real/h200_qwen2.5-7b",
           "serving_repeats/h200_qwen2.5-7b_table_host"),
    Repeat("h200/deepseek-v2-lite", "two H200s", "real/h200_deepseek-v2-lite",
           "serving_repeats/h200_deepseek-v2-lite_host2"),
    Repeat("h200/gemma-3-27b", "two H200s (four cases)", "real/h200_gemma-3-27b",
           "serving_repeats/h200_gemma-3-27b_host2"),
    Repeat("h200/deepseek-v2-lite", "two H200s (a third)", "real/h200_deepseek-v2-lite",
           "serving_repeats/h200_deepseek-v2-lite_host3"),
    Repeat("h200/llama-3-8b-fp8", "two H200s", "real/h200_llama-3-8b-fp8",
           "serving_repeats/h200_llama-3-8b-fp8_host2"),
    Repeat("h200/llama-3-8b-fp8", "two H200s (a third)", "real/h200_llama-3-8b-fp8",
           "serving_repeats/h200_llama-3-8b-fp8_host3"),
)  # fmt: skip


def case_names() -> list[str]:
    return [f"{trace}_{load}" for trace, load, _ in cases()]


def simulated_against(rep: Repeat, run: str) -> dict:
    """The validation report (shipped table, `vllm` policy) of ``rep``'s served model against
    the replay in ``run`` (a folder relative to this one), as `run_all.report` makes it."""
    (pair,) = [p for p in PAIRS if p.key == rep.key]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / pair.name).symlink_to((HERE / run).resolve())
        return report(Path(tmp))


def _errs(results: dict) -> list[float]:
    return [m["err"] for r in results.values() for m in r["metrics"]]


def simulate_all() -> dict[str, dict]:
    """Run folder -> the simulator's report against it, for every replay of `REPEATS` (each
    once, though a replay sits in several pairs)."""
    simulated: dict[str, dict] = {}
    for rep in REPEATS:
        for run in (rep.a, rep.b):
            if run not in simulated:
                simulated[run] = simulated_against(rep, run)
    return simulated


def spread_table(found: list[tuple[Repeat, dict]], simulated: dict[str, dict]) -> str:
    """Per pair of replays: values, median |b/a - 1|, how many beyond 15%, max; beside it the
    simulator's error (its shipped table, the `vllm` policy) against each of the two replays
    (``simulated``: `simulate_all`)."""
    lines = [
        "| served model | replays | values | median abs difference | beyond 15% | max "
        "| servesim vs a: median, beyond, max | servesim vs b |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rep, res in found:
        errs = _errs(res)
        sim = [", ".join(error_stats(_errs(simulated[run]), MISS)) for run in (rep.a, rep.b)]
        diff = " | ".join(error_stats(errs, MISS))
        lines.append(f"| {rep.key} | {rep.how} | {len(errs)} | {diff} | {sim[0]} | {sim[1]} |")
    return "\n".join(lines)


def by_metric_table(found: list[tuple[Repeat, dict]], sim: dict) -> str:
    """Per metric, over the comparisons whose reference is a shipped replay: how many of the
    replay-to-replay differences and of the simulator's errors on the same cases lie beyond 15%
    (counted per comparison: a served model compared with two other replays counts its
    simulator errors twice, once beside each)."""
    rep_miss: dict[str, list[int]] = {}
    sim_miss: dict[str, list[int]] = {}
    for rep, res in found:
        if not rep.a.startswith("real/"):
            continue
        for case, r in res.items():
            for m in r["metrics"]:
                rep_miss.setdefault(m["metric"], []).append(abs(m["err"]) > MISS)
            for m in sim.get(f"{rep.key}/{case}", {}).get("metrics", []):
                sim_miss.setdefault(m["metric"], []).append(abs(m["err"]) > MISS)
    lines = ["| metric | replay vs replay beyond 15% | servesim vs replay beyond 15% |",
             "| --- | --- | --- |"]  # fmt: skip
    for metric, flags in rep_miss.items():
        s = sim_miss.get(metric, [])
        lines.append(f"| {metric} | {sum(flags)} of {len(flags)} | {sum(s)} of {len(s)} |")
    return "\n".join(lines)


def within_replays_table(found: list[tuple[Repeat, dict]], sim: dict) -> str:
    """Per served model with a shipped replay and at least one other: of the simulator's values
    beyond 15% of the shipped replay, how many lie between the smallest and the largest value
    the replays of that case gave (the shipped one and every other stored one)."""
    span: dict[str, dict[str, list[float]]] = {}
    for rep, res in found:
        if not rep.a.startswith("real/"):
            continue
        for case, r in res.items():
            per = span.setdefault(f"{rep.key}/{case}", {})
            for m in r["metrics"]:
                per.setdefault(m["metric"], [m["a"]]).append(m["b"])
    counts: dict[str, list[int]] = {}  # served model -> [replays a case, misses, inside]
    for case, per in span.items():
        row = counts.setdefault(case.rsplit("/", 1)[0], [0, 0, 0])
        row[0] = max(row[0], len(next(iter(per.values()))))
        for m in sim[case]["metrics"]:
            if abs(m["err"]) > MISS:
                vals = per[m["metric"]]
                row[1] += 1
                row[2] += min(vals) <= m["sim"] <= max(vals)
    lines = ["| served model | replays of a case | servesim beyond 15% of the shipped replay "
             "| of those, between the replays' values |", "| --- | --- | --- | --- |"]  # fmt: skip
    lines += [f"| {key} | {n} | {miss} | {inside} |" for key, (n, miss, inside) in counts.items()]
    return "\n".join(lines)


def replays_by_model() -> dict[str, list[str]]:
    """Served model -> its replay folders in `REPEATS`, each once, in order of first mention."""
    runs: dict[str, list[str]] = {}
    for rep in REPEATS:
        for run in (rep.a, rep.b):
            if run not in runs.setdefault(rep.key, []):
                runs[rep.key].append(run)
    return runs


#: the fewest other replays whose median stands for the oracle (one would be a replay pair)
ORACLE_MIN_OTHERS = 2


def oracle_errors(key: str, runs: list[str], simulated: dict[str, dict]) -> tuple[list, list]:
    """The leave-one-out oracle's errors (`profiles.replay_spread.leave_one_out` over ``runs``,
    the replays of served model ``key``) and the simulator's errors against the same
    references, cases and metrics, in the same order (``pred / ref - 1``)."""
    vals = {run: {c: metric_values(load_phase(HERE / run / f"{c}.json.gz"))
                  for c in case_names() if (HERE / run / f"{c}.json.gz").is_file()}
            for run in runs}  # fmt: skip
    oracle, sim = [], []
    sim_err = {(run, c, m["metric"]): m["err"] for run in runs
               for c in vals[run] for m in simulated[run][f"{key}/{c}"]["metrics"]}  # fmt: skip
    for ref, case, metric, err in leave_one_out(vals, ORACLE_MIN_OTHERS):
        oracle.append(err)
        sim.append(sim_err[(ref, case, metric)])
    return oracle, sim


def oracle_table(simulated: dict[str, dict]) -> str:
    """Per served model with three replays or more: the leave-one-out oracle of
    `oracle_errors` (vLLM's own other runs, as a predictor no simulator of one expected timing
    can beat by much) against the simulator, on the same reference values. What it answers:
    whether "no metric beyond 15% of one replay" can be met by any prediction at all."""
    lines = ["| served model | replays | values | oracle (median of the other replays): "
             "median, beyond 15%, max | servesim: median, beyond 15%, max "
             "| servesim / oracle beyond 15% |",
             "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for key, runs in replays_by_model().items():
        if len(runs) < ORACLE_MIN_OTHERS + 1:
            continue
        oracle, sim = oracle_errors(key, runs, simulated)
        o, s = (", ".join(error_stats(e, MISS)) for e in (oracle, sim))
        ratio = beyond_ratio(sim, oracle, MISS)
        lines.append(f"| {key} | {len(runs)} | {len(oracle)} | {o} | {s} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", help="a reference replay folder (with --b: compare these two only)")
    ap.add_argument("--b", help="the other replay folder")
    ap.add_argument("--out", default=str(HERE / "spread.md"), help="where the tables go")
    a = ap.parse_args(argv)
    if bool(a.a) != bool(a.b):
        ap.error("--a and --b go together (two replay folders)")
    try:
        if a.a:
            res = compare_runs(Path(a.a), Path(a.b), case_names())
            print(totals_table({f"{a.b}/{c}": r for c, r in res.items()}, MISS))
            return 0
        found = [(r, compare_runs(HERE / r.a, HERE / r.b, case_names())) for r in REPEATS]
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sim = json.loads((HERE / "report.json").read_text())
    simulated = simulate_all()
    tables = [spread_table(found, simulated), by_metric_table(found, sim),
              within_replays_table(found, sim), oracle_table(simulated)]  # fmt: skip
    text = "\n\n".join(tables) + "\n"
    Path(a.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
