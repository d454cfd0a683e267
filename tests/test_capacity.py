import pytest
import yaml
from tooling_helpers import tiny

from simulator.capacity import Probe, judge, parse_slo, probe_config, search
from simulator.cli import main
from simulator.errors import ConfigError


def fake(threshold):
    calls = []

    def evaluate(rate):
        calls.append(rate)
        return Probe(rate, rate <= threshold)

    return evaluate, calls


@pytest.mark.parametrize("start", [0.5, 7.0, 7.3, 100.0])
def test_bisection_finds_a_known_threshold(start):
    evaluate, calls = fake(7.3)
    s = search(evaluate, start, tolerance=0.01)
    assert s.rate <= 7.3 < s.bracket[1]
    assert (s.bracket[1] - s.rate) <= 0.01 * s.bracket[1]
    assert s.runs == len(calls) == len(set(calls))
    assert s.runs < 20


def test_search_reports_infeasible_and_unbounded():
    s = search(fake(-1)[0], 1.0, min_rate=0.1)
    assert s.rate is None and "infeasible" in s.note
    s = search(fake(1e9)[0], 1.0, max_rate=100)
    assert s.rate == 64 and "still feasible" in s.note


def test_max_runs_bounds_the_search():
    s = search(fake(3.3)[0], 1.0, tolerance=1e-9, max_runs=6)
    assert s.runs == 6 and s.rate <= 3.3 and "stopped" in s.note


def test_slo_semantics():
    assert parse_slo("ttft_p95=0.5").limit_s == 0.5
    assert parse_slo("tpot=0.05").percentile is None
    with pytest.raises(ConfigError):
        parse_slo("e2e_p95=1")
    slos = [parse_slo("ttft_p95=0.5")]
    good = {"slo_attainment": 0.95, "ttft_s": {"p95": 0.4}}
    assert judge(good, slos, 0.9).ok
    assert not judge({**good, "slo_attainment": 0.85}, slos, 0.9).ok
    assert not judge({**good, "ttft_s": {"p95": 0.6}}, slos, 0.9).ok
    cfg = probe_config(tiny(), slos + [parse_slo("tpot_p99=0.05")], 3.0, 100)
    assert cfg["workload"]["arrival"]["rate_per_s"] == 3.0
    assert cfg["workload"]["limits"]["max_requests"] == 100
    assert cfg["slo"] == {"ttft_ms": 500.0, "tpot_ms": 50.0}


def test_cli_capacity(tmp_path, capsys):
    f = tmp_path / "e.yaml"
    f.write_text(yaml.safe_dump(tiny()))
    argv = [
        "capacity",
        str(f),
        "--slo",
        "ttft_p95=0.2",
        "--slo",
        "tpot_p95=0.02",
        "--max-requests",
        "40",
        "--policies",
        "continuous,dynamic",
        "--tolerance",
        "0.1",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith(("continuous", "dynamic"))]
    assert len(rows) == 2
    cont, stat = float(rows[0][1]), float(rows[1][1])
    assert cont > 0 and cont >= stat
