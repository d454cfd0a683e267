"""`validation/vllm-0.24/run_all.py`: its options, and the report on another table (CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN_ALL = REPO / "validation/vllm-0.24/run_all.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(RUN_ALL), *args], capture_output=True, text=True, cwd=REPO
    )


def test_a_bad_table_option_names_the_option_and_the_expected_form():
    done = _run("report", "--table", "h100-llama=/tmp/x")
    assert done.returncode == 2
    assert "--table 'h100-llama=/tmp/x': expected GPU/MODEL=DIR" in done.stderr


def test_report_on_another_table_runs_only_that_pair_and_writes_where_told(tmp_path):
    # the shipped H100 Qwen table named as "another" one: the same figures as the shipped
    # report's H100 Qwen cases, written to --out, the shipped report left alone
    shipped = REPO / "validation/vllm-0.24/report.json"
    before = shipped.read_bytes()
    table = REPO / "profiles/h100/vllm-0.24/qwen2.5-7b_tp1"
    done = _run("report", "--table", f"h100/qwen2.5-7b={table}", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads((tmp_path / "report.json").read_text())
    ref = json.loads(before)
    assert sorted(got) == sorted(k for k in ref if k.startswith("h100/qwen2.5-7b/"))
    for case, res in got.items():
        assert res["metrics"] == ref[case]["metrics"]
    assert shipped.read_bytes() == before
    assert (tmp_path / "summary.md").is_file() and (tmp_path / "table.md").is_file()


def test_the_totals_count_every_value_per_served_model_and_over_all(monkeypatch):
    monkeypatch.syspath_prepend(str(RUN_ALL.parent))
    from run_all import totals_table

    def case(*errs):
        return {"metrics": [{"err": e} for e in errs]}

    got = totals_table(
        {
            "h200/a/conv_light": case(0.01, -0.2),
            "h200/a/arxiv_light": case(0.03, 0.17),
            "h100/b/conv_light": case(-0.1, 0.15),
        }  # fmt: skip
    )
    rows = [line.split(" | ") for line in got.splitlines()[2:]]
    # h200/a: |errors| 0.01, 0.2, 0.03, 0.17 -> median 0.1, two beyond 15%; 0.15 is not beyond
    assert rows[0] == ["| h200/a", "4", "10.0%", "2", "20% |"]
    assert rows[1] == ["| h100/b", "2", "12.5%", "0", "15% |"]
    assert rows[2] == ["| all", "6", "12.5%", "2", "20% |"]
