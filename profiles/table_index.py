"""``servesim profile tables [ROOT]``: every engine table under ROOT, one row each, with the
held-out error it publishes and whether it meets the floor a shipped table is held to.

Why: the accuracy of a table is a property of the table, computed from its own ``steps.csv``
(`EngineStepModel.heldout`: the steps its fit never saw), so the list of what exists and how
good each is should be computed, not copied into prose by hand (the README's table drifted: it
once said "all but seven" where eight tables missed). The ``spread`` column is vLLM against
itself (`engine_steps.repeat_spread`: each timing of a composition timed three or more times
against their median), the noise under which no step model can go on single intervals; ``-``
where the table timed no composition three times. ``neighbours p95`` is vLLM against itself
within one pass (`simulator.latency.step_oracle`): the p95 error of predicting each held-out
decode step by the median of its near-equal neighbours in the same decode chain, beside the
model's p95 on the same steps. ``cross-pass p95`` is vLLM against itself across passes
(`step_oracle.cross_pass_oracle`): each held-out step's single timing predicted by the median of
the same composition's timings in the table's other passes, minutes apart, beside the model's
p95 on the same single timings; ``-`` for a table recorded in one pass. ``stamps out`` is the
share of the recorded steps left out of the fit and of the judge because their completion stamps
were wrong (`profiles.vllm_table.flag_early_stamps`, `flag_shifted_stamps`): a reader should see
how much cleaning a table's numbers stand on. ``energy`` is the energy law's held-out error on
the joules of the test scenarios (`simulator.energy.MeasuredStepEnergy.heldout`, median / p95),
``-`` for a table without power readings; it is reported, not part of the floor. ``launches``
counts the prompt-step launches behind decode steps the table's fit attributed, within the
largest CUDA graph / above it (`EngineStepModel._fit_launch`): the simulator draws every such
launch from these, so they set light-load TTFT and token-gap tails, and a handful (tables
recorded before the grid's ``arrive`` family: 4 / 12 for the H100 Llama-3-8B table) is a thin
sample of a host's spread; under 3, that kind is charged no launch. ``eager ms by process``: the
median eager launch of each engine process the table's run used, read from its raw stamps
(meta.yaml ``launches_by_engine_process``; processes without eager launches left out): the
launch time is drawn per process (profiles/README.md, "One pass per engine process"), so one
value is one draw and several show the spread.

Floor (issue 13 / 15): held-out median <= 5% and p95 <= 10% of whole-step time. No GPU needed.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from profiles.report_fmt import pct
from simulator.errors import ConfigError
from simulator.latency.engine_steps import EngineStepModel, is_engine_table

#: a table cell: "-" where a statistic has no steps
_cell = functools.partial(pct, missing="-")


#: the held-out floor of a shipped table: (median, p95) of |sim / real - 1| over its test steps
FLOOR_MEDIAN, FLOOR_P95 = 0.05, 0.10

COLUMNS = (
    "table", "steps", "stamps out", "median", "p95", "decode-only p95", "with-prefill p95",
    "spread p95", "neighbours p95 vLLM / sim", "cross-pass p95 vLLM / sim", "energy", "launches",
    "eager ms by process", "floor",
)  # fmt: skip


def engine_tables(root: Path) -> list[Path]:
    """The engine-table folders under ``root`` (any depth), sorted by path."""
    return sorted(p.parent for p in root.rglob("meta.yaml") if is_engine_table(p.parent))


def table_row(table_dir: Path) -> dict:
    """One table's published accuracy (fractions; ``spread_p95`` None when not measured)."""
    m = EngineStepModel.as_measured(table_dir)
    h = m.heldout()
    spread = h["repeat_spread"]
    row = {
        "table": m.name,
        "steps": h["all"]["steps"],
        "median": h["all"]["median"],
        "p95": h["all"]["p95"],
        "decode_p95": h["decode_only"]["p95"],
        "prefill_p95": h["with_prefill"]["p95"],
        "spread_p95": spread["p95"] if spread.get("steps") else None,
        "neighbours": h["neighbour_oracle"],
        "cross_pass": h["cross_pass_oracle"],
        "stamps_out": _stamps_out(m.meta.get("steps") or {}),
        "energy": m.energy.heldout() if m.energy is not None else None,
        "launches": (m.launch_counts[True], m.launch_counts[False]),
        "eager_by_process": [
            p["eager"]["p50_ms"]
            for p in m.meta.get("launches_by_engine_process") or []
            if p["eager"]["p50_ms"] is not None
        ],
    }
    row["meets_floor"] = row["median"] <= FLOOR_MEDIAN and row["p95"] <= FLOOR_P95
    return row


def _stamps_out(steps: dict) -> float | None:
    """Share of recorded steps left out for wrong completion stamps (None: not counted)."""
    out = steps.get("early_stamp_steps_left_out", 0) + steps.get("shifted_stamp_steps_left_out", 0)
    return out / steps["recorded"] if steps.get("recorded") else None


def _energy_cell(heldout: dict | None) -> str:
    """``median / p95`` of the energy law's held-out error, or ``-`` (no readings, or no
    held-out scenario long enough to judge)."""
    if not heldout or not heldout.get("scenarios"):
        return "-"
    return f"{_cell(heldout['median'])} / {_cell(heldout['p95'])}"


def _oracle_cell(oracle: dict | None) -> str:
    """``vLLM / sim`` p95 on the steps an oracle predicts (`neighbour_oracle`,
    `cross_pass_oracle`), or ``-`` (none)."""
    if not oracle or not oracle["oracle"].get("steps"):
        return "-"
    return f"{_cell(oracle['oracle']['p95'])} / {_cell(oracle['model']['p95'])}"


def _launch_cell(counts: tuple[int, int] | None) -> str:
    """``graph / eager`` launch counts, or ``-`` (not known)."""
    return "-" if counts is None else f"{counts[0]} / {counts[1]}"


def _by_process_cell(medians: list[float] | None) -> str:
    """Each engine process's median eager launch (ms), or ``-`` (none recorded)."""
    return " / ".join(f"{v:.0f}" for v in medians) if medians else "-"


def format_rows(rows: list[dict]) -> str:
    """A markdown table of `table_row`s and a count of those meeting the floor."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for r in rows:
        cells = [
            r["table"], f"{r['steps']:,}", _cell(r.get("stamps_out")),
            _cell(r["median"]), _cell(r["p95"]), _cell(r["decode_p95"]), _cell(r["prefill_p95"]),
            _cell(r["spread_p95"]), _oracle_cell(r.get("neighbours")),
            _oracle_cell(r.get("cross_pass")),
            _energy_cell(r.get("energy")), _launch_cell(r.get("launches")),
            _by_process_cell(r.get("eager_by_process")),
            "met" if r["meets_floor"] else "**missed**",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    met = sum(r["meets_floor"] for r in rows)
    lines.append("")
    lines.append(
        f"{met} of {len(rows)} tables meet the floor (held-out median <= "
        f"{FLOOR_MEDIAN:.0%}, p95 <= {FLOOR_P95:.0%})"
    )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="servesim profile tables",
        description="held-out error of every engine table under ROOT, and the floor (no GPU)",
    )
    ap.add_argument("root", nargs="?", default="profiles", help="folder to search (profiles)")
    a = ap.parse_args(argv)
    root = Path(a.root)
    if not root.is_dir():
        raise ConfigError(a.root, "ROOT", "expected a folder of tables")
    tables = engine_tables(root)
    if not tables:
        raise ConfigError(a.root, "ROOT", "no engine table (meta.yaml kind: engine_steps) in it")
    print(format_rows([table_row(t) for t in tables]))
    return 0
