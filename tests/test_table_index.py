"""`servesim profile tables`: every engine table's published held-out error and the floor."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from profiles.cli import main as profile_main
from profiles.table_index import engine_tables, format_rows, table_row
from simulator.latency.engine_steps import EngineStepModel

REPO = Path(__file__).resolve().parents[1]
#: the smallest shipped engine table (276 steps): fast to fit
SMALL = REPO / "profiles/h200/vllm-0.24/llama-3-70b_tp2"


def _row(median, p95, spread=None):
    return {
        "table": "t", "steps": 1234, "median": median, "p95": p95, "decode_p95": p95,
        "prefill_p95": p95, "spread_p95": spread, "meets_floor": median <= 0.05 and p95 <= 0.1,
    }  # fmt: skip


def test_a_row_is_the_tables_own_heldout_report(tmp_path):
    """The row says what `EngineStepModel.heldout` says for the table (nothing refitted, nothing
    taken from elsewhere), and the floor is judged on those numbers."""
    dest = tmp_path / "h200" / "vllm-0.24" / SMALL.name
    shutil.copytree(SMALL, dest, ignore=shutil.ignore_patterns("raw"))
    assert engine_tables(tmp_path) == [dest]
    row = table_row(dest)
    h = EngineStepModel(dest, "llama-3-70b", 2).heldout()
    assert (row["steps"], row["median"], row["p95"]) == (
        h["all"]["steps"], h["all"]["median"], h["all"]["p95"],
    )  # fmt: skip
    assert row["decode_p95"] == h["decode_only"]["p95"]
    assert row["prefill_p95"] == h["with_prefill"]["p95"]
    assert row["spread_p95"] is None  # one pass: no composition timed three times
    assert row["neighbours"] == h["neighbour_oracle"] and row["neighbours"]["oracle"]["steps"]
    assert row["cross_pass"] == h["cross_pass_oracle"]
    assert row["cross_pass"]["oracle"]["steps"] == 0  # one pass: no other pass to predict from
    assert row["meets_floor"] is (row["median"] <= 0.05 and row["p95"] <= 0.10)
    steps = yaml.safe_load((dest / "meta.yaml").read_text())["steps"]
    left_out = steps["early_stamp_steps_left_out"] + steps["shifted_stamp_steps_left_out"]
    assert row["stamps_out"] == left_out / steps["recorded"]
    assert row["energy"] == EngineStepModel(dest, "llama-3-70b", 2).energy.heldout()
    m = EngineStepModel(dest, "llama-3-70b", 2)
    assert row["launches"] == (m.launch_counts[True], m.launch_counts[False])
    procs = yaml.safe_load((dest / "meta.yaml").read_text())["launches_by_engine_process"]
    assert row["eager_by_process"] == [p["eager"]["p50_ms"] for p in procs]


def test_the_by_process_cell_lists_each_engines_eager_launch_median():
    rows = [{**_row(0.01, 0.02), "eager_by_process": [98.87, 64.11]}, _row(0.01, 0.02)]
    lines = format_rows(rows).splitlines()
    assert lines[2].endswith("| 99 / 64 | met |") and lines[3].endswith("| - | met |")


def test_the_launch_cell_counts_graph_and_eager_launches_or_a_dash():
    lines = format_rows([{**_row(0.01, 0.02), "launches": (4, 12)}, _row(0.01, 0.02)]).splitlines()
    assert lines[2].endswith("| - | 4 / 12 | - | met |") and lines[3].endswith(
        "| - | - | - | met |"
    )
    # spread, neighbours, cross-pass, energy
    assert lines[2].endswith("| - | - | - | - | 4 / 12 | - | met |")


def test_the_oracle_cells_are_vllms_and_the_models_p95_or_a_dash():
    oracle = {"oracle": {"steps": 9, "p95": 0.066}, "model": {"steps": 9, "p95": 0.077}}
    across = {"oracle": {"steps": 5, "p95": 0.311}, "model": {"steps": 5, "p95": 0.208}}
    none = {"oracle": {"steps": 0}, "model": {"steps": 0}}
    rows = [
        {**_row(0.01, 0.02), "neighbours": oracle, "cross_pass": across},
        {**_row(0.01, 0.02), "neighbours": none, "cross_pass": none},
    ]
    lines = format_rows(rows).splitlines()
    assert lines[2].endswith("| - | 6.6% / 7.7% | 31.1% / 20.8% | - | - | - | met |")
    assert lines[3].endswith("| - | - | - | - | - | - | met |")


def test_the_energy_cell_is_median_and_p95_or_a_dash():
    with_energy = {**_row(0.01, 0.02), "energy": {"scenarios": 9, "median": 0.011, "p95": 0.056}}
    no_test = {**_row(0.01, 0.02), "energy": {"scenarios": 0}}
    lines = format_rows([with_energy, no_test, _row(0.01, 0.02)]).splitlines()
    assert lines[2].endswith("| 1.1% / 5.6% | - | - | met |")
    assert lines[3].endswith("| - | - | - | met |") and lines[4].endswith("| - | - | - | met |")


def test_the_floor_is_median_5_and_p95_10_percent_inclusive():
    text = format_rows([_row(0.05, 0.10), _row(0.01, 0.1001), _row(0.0501, 0.02, 0.034)])
    lines = text.splitlines()
    assert lines[2].endswith("| 5.0% | 10.0% | 10.0% | 10.0% | - | - | - | - | - | - | met |")
    assert lines[3].endswith("| **missed** |")
    assert lines[4].endswith("| 3.4% | - | - | - | - | - | **missed** |")
    assert lines[-1].startswith("1 of 3 tables meet the floor")


def test_a_folder_without_tables_is_one_line_naming_it(tmp_path, capsys):
    assert profile_main(["tables", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"servesim profile: error: {tmp_path}") and "no engine table" in err
    assert profile_main(["tables", str(tmp_path / "absent")]) == 2
    assert "expected a folder" in capsys.readouterr().err


def test_percentages_print_one_way_in_every_report():
    from profiles.report_fmt import pct

    assert (pct(0.0534), pct(-0.0534, signed=True), pct(0.1, signed=True)) == (
        "5.3%",
        "-5.3%",
        "+10.0%",
    )
    # a statistic over no steps: None or NaN, never "nan%"
    assert (pct(None), pct(float("nan")), pct(None, missing="-")) == ("n/a", "n/a", "-")
