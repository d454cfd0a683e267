"""The CLI explains itself: help on every option, progress on a terminal only, a summary that
accounts for every request and says whether the seed mattered (issue 16, item 5)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import pickle
from pathlib import Path

import pytest
import yaml

from profiles.cli import main as profile_main
from simulator.cli import main, make_parser
from simulator.errors import ConfigError
from simulator.metrics import reject_cause
from simulator.progress import RunProgress, wanted
from simulator.results import format_summary
from simulator.runner import build, simulate
from workloads.loaders import TraceFormatError

REPO = Path(__file__).resolve().parents[1]
BASE = yaml.safe_load((REPO / "tests" / "bad_inputs" / "base.yaml").read_text())


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def test_every_option_and_positional_has_help():
    missing = [
        f"{name} {action.dest}"
        for name, sub in _subparsers(make_parser())
        for action in sub._actions
        if not isinstance(action, argparse._HelpAction) and not action.help
        and name not in ("profile", "validate")  # their own parsers, checked below
    ]  # fmt: skip
    assert not missing


@pytest.mark.parametrize(
    "argv", [["profile", "--help"], ["profile", "report", "--help"], ["profile", "diff", "--help"],
             ["profile", "tables", "--help"], ["validate", "--help"]],
)  # fmt: skip
def test_profile_and_validate_help_describe_every_argument(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    out = capsys.readouterr().out
    if argv == ["profile", "--help"]:
        assert "profile report DIR" in out and "profile diff OLD NEW" in out
        assert "profile tables [ROOT]" in out
    assert not _bare_arguments(out), out


def _bare_arguments(help_text: str) -> list[str]:
    """Arguments a --help text lists without a description: argparse prints an argument's
    help on its own line or, when the name is long, on the next, deeper-indented line."""
    lines = help_text.split("\n")
    start = next(i for i, ln in enumerate(lines) if ln.endswith("arguments:") or ln == "options:")
    bare = []
    for i, ln in enumerate(lines[start:], start):
        name_only = ln.startswith("  ") and not ln.startswith("   ") and len(ln.split()) <= 2
        follows = lines[i + 1] if i + 1 < len(lines) else ""
        if name_only and "--help" not in ln and not follows.startswith(" " * 8):
            bare.append(ln.strip())
    return bare


def test_profile_subcommand_errors_are_one_line(capsys):
    assert profile_main(["report", "/nonexistent/table"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servesim profile: error: /nonexistent/table") and "Traceback" not in err


def _run(config: dict, tmp_path: Path):
    return simulate(build(config, "exp.yaml", tmp_path))


def test_summary_says_a_trace_replay_draws_nothing_and_synthetic_arrivals_do(tmp_path):
    replay = dict(BASE, workload={
        "trace": {"path": "tests/data/workloads/vidur_small.csv"},
        "arrival": {"process": "trace"},
    })  # fmt: skip
    seed = _run(replay, tmp_path).summary["seed"]
    assert seed == {"value": 0, "random_draws": [], "matters": False}
    seed = _run(BASE, tmp_path).summary["seed"]
    assert seed["random_draws"] == ["arrivals"] and seed["matters"]
    spec = dict(BASE, scheduler={"policy": "speculative"})
    assert "policy (replica 0)" in _run(spec, tmp_path).summary["seed"]["random_draws"]


def test_trace_replay_results_do_not_depend_on_the_seed(tmp_path):
    """What seed.matters: false promises."""
    replay = dict(BASE, workload={
        "trace": {"path": "tests/data/workloads/vidur_small.csv"},
        "arrival": {"process": "trace"},
    })  # fmt: skip
    a, b = _run(dict(replay, seed=1), tmp_path), _run(dict(replay, seed=2), tmp_path)
    assert a.summary["ttft_s"] == b.summary["ttft_s"]
    assert a.requests["finish_s"].tolist() == b.requests["finish_s"].tolist()


def test_reject_reasons_are_grouped_by_cause_in_summary_and_console(tmp_path):
    cfg = dict(BASE, kv_cache={**BASE["kv_cache"], "on_oversize": "reject"}, workload={
        **BASE["workload"],
        "lengths": {"input": {"dist": "uniform", "low": 1, "high": 12000},
                    "output": {"dist": "fixed", "value": 10}},
        "num_requests": 40,
    })  # fmt: skip
    s = _run(cfg, tmp_path).summary
    r = s["requests"]
    assert r["rejected"] > 1 and len(r["reject_reasons"]) == r["rejected"]  # one per length
    assert r["reject_causes"] == {"prompt+output > max_model_len 8192": r["rejected"]}
    assert f"rejected: {r['rejected']} x prompt+output > max_model_len 8192" in format_summary(s)
    assert reject_cause("needs 600 KV blocks > 512 usable") == "needs KV blocks > 512 usable"


def test_console_summary_counts_requests_not_arrived_by_the_horizon(tmp_path):
    cfg = dict(BASE, sim={"horizon_s": 1.0})
    s = _run(cfg, tmp_path).summary
    late = s["requests"]["not_arrived_by_horizon"]
    assert late > 0
    assert f", {late} not arrived by the horizon;" in format_summary(s)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_only_on_a_terminal_without_quiet_or_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    assert wanted(False, _Terminal())
    assert not wanted(True, _Terminal())
    assert not wanted(False, io.StringIO())
    monkeypatch.setenv("CI", "true")
    assert not wanted(False, _Terminal())


@pytest.mark.parametrize("horizon", [None, 1.5])
def test_progress_reports_and_changes_nothing(tmp_path, horizon):
    cfg = dict(BASE, workload={**BASE["workload"], "num_requests": 300},
               sim={"horizon_s": horizon})  # fmt: skip
    plain = _run(cfg, tmp_path)
    stream = _Terminal()
    bar = RunProgress(300, stream=stream, every_s=0.0)
    built = build(cfg, "exp.yaml", tmp_path)
    shown = simulate(built, progress=bar)
    bar.close()
    assert "requests done" in stream.getvalue() and "simulated requests/s" in stream.getvalue()
    # the last line counts what the run finished or rejected (it said 0 while the cluster kept
    # no `Request` objects, which runs have not since the request log)
    last = stream.getvalue().split("\r")[-1]
    r = shown.summary["requests"]
    assert f"| {r['completed'] + r['rejected']:,}/300 requests done |" in last
    assert r["completed"] > 0 and " 0 simulated requests/s" not in last
    assert json.dumps(plain.summary, default=str) == json.dumps(shown.summary, default=str)
    assert plain.steps["start_s"].tolist() == shown.steps["start_s"].tolist()


def test_progress_counts_the_requests_a_decode_pool_rejects():
    """P/D: a request the decode pool can never hold is rejected at hand-off (by `disagg`, not
    by a replica's policy); the progress line counts it as done."""
    from tests.policy_kit import config

    cfg = config(
        n=40, rate=4.0, kv_cache={"on_oversize": "reject"},
        cluster={"mode": "disaggregated", "prefill": {"replicas": 1}, "link": "nvlink",
                 "decode": {"replicas": 1, "kv_cache": {"num_blocks": 40}}},
    )  # fmt: skip
    stream = _Terminal()
    bar = RunProgress(40, stream=stream, every_s=0.0)
    r = simulate(build(cfg, "t.yaml", "."), progress=bar).summary["requests"]
    assert r["rejected"] == r["arrived"] > 0 and not r["completed"]
    assert all(k.startswith("decode pool") for k in r["reject_reasons"])
    assert f"| {r['rejected']}/40 requests done |" in stream.getvalue().split("\r")[-1]


def test_run_prints_no_progress_into_a_pipe(tmp_path, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["run", str(REPO / "tests/bad_inputs/base.yaml"), "--out", str(tmp_path)])
    assert code == 0 and "requests done" not in err.getvalue()


def test_config_errors_survive_a_process_pool():
    for e in (ConfigError("a.yaml", "k.x", "bad"), TraceFormatError(Path("t.csv"), "m", 3, 2, "c")):
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and back.one_line() == e.one_line() and back.key == e.key


def test_validate_still_reports_a_matching_committed_real_run(tmp_path, capsys):
    argv = ["validate", str(REPO / "validation/configs/val_static.yaml"),
            "--set", "workload.arrival.rate_per_s=5", "--set", "workload.num_requests=80",
            "--real-json", str(REPO / "validation/static_heavy/real.json.gz"),
            "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    assert (tmp_path / "report.md").read_text().startswith("# Validation: val_static")
