"""``servesim plan`` on a tiny space whose answer is known by hand.

Why these numbers: with ``latency: constant`` (every step 10 ms) and ``max_num_seqs: 1`` a
replica serves one request at a time, and a request of 100 prompt + 10 output tokens takes one
prefill step (its first token) plus 9 decode steps = 100 ms. A replica therefore keeps up with
10 req/s. Above that, with constant arrivals at rate r, request k waits k x (0.1 - 1/r) s; over
the 200 requests of a capacity run the p95 TTFT (request ~190) stays under 500 ms up to
r = 1 / (0.1 - 0.49 / 190) = 10.26 req/s. So each replica's capacity is in [10, 10.26], and
35 req/s needs ceil(35 / 10.x) = 4 replicas; at 35 req/s round robin gives each 8.75 req/s, so
the verification passes. The cheap GPU ($1/h) then wins over the pricey one ($3/h): $4/h.
A 50 ms step decodes one request alone at 50 ms per token > the 30 ms TPOT limit (pruned), and
a 10 GB GPU cannot hold Llama-3-8B's 16 GB of weights (pruned).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from simulator.cli import main
from simulator.errors import ConfigError
from simulator.planner import fallback_warnings, plan, read_plan, record_file, scaled_config

TINY = {
    "name": "tiny_plan",
    "experiment": {
        "model": "llama-3-8b",
        "hardware": {"gpu": "h100-sxm", "tp": 1},
        "scheduler": {"policy": "continuous", "max_num_seqs": 1},
        "kv_cache": {"allocator": "paged", "block_size": 16},
        "latency": {"model": "constant", "step_ms": 10},
        "workload": {
            "arrival": {"process": "constant", "rate_per_s": 1.0},
            "lengths": {
                "input": {"dist": "fixed", "value": 100},
                "output": {"dist": "fixed", "value": 10},
            },
            "num_requests": 1000,
        },
    },
    "target_rate_per_s": 35,
    "slo": {"ttft_p95_ms": 500, "tpot_p95_ms": 30, "attainment": 0.9},
    "space": {
        "hardware.gpu": [
            {"base": "h100-sxm", "name": "cheap", "price_per_hour": 1.0},
            {"base": "h200", "name": "pricey", "price_per_hour": 3.0},
            {"base": "l40s", "name": "tiny", "memory_gb": 10, "price_per_hour": 0.5},
        ],
        "latency.step_ms": [10, 50],
    },
    "search": {"max_requests": 200, "tolerance": 0.02, "max_runs": 20, "verify_top": 2},
}


def _write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _by_gpu(run, gpu: str, step_ms: int) -> dict:
    return next(
        u for u in run.units
        if u["values"]["hardware.gpu"]["name"] == gpu and u["values"]["latency.step_ms"] == step_ms
    )  # fmt: skip


def test_tiny_plan_finds_the_answer_known_by_hand(tmp_path):
    run = plan(read_plan(_write(tmp_path, TINY)), tmp_path / "out")
    cheap, pricey = _by_gpu(run, "cheap", 10), _by_gpu(run, "pricey", 10)
    for unit in (cheap, pricey):
        assert 10.0 <= unit["capacity_rps"] <= 10.27
        assert unit["replicas"] == 4
    assert run.answer is cheap
    assert cheap["usd_per_hour"] == pytest.approx(4.0)
    assert pricey["usd_per_hour"] == pytest.approx(12.0)
    assert cheap["verified"] == "passed"
    assert cheap["tpot_p95_s"] == pytest.approx(0.010)
    # energy, the second objective: a request is 10 steps of 10 ms; the TDP estimate charges
    # busy time only, 700 W x 0.1 s = 70 J for 10 output tokens, whatever the load
    assert cheap["joules_per_output_token"] == pytest.approx(7.0)
    assert cheap["energy_source"] == "tdp_estimate"
    # pruned without a simulation: two memory misfits, two TPOT misses at batch 1
    assert run.count(prune="memory") == 2 and run.count(prune="tpot") == 2
    assert _by_gpu(run, "cheap", 50)["tpot_floor_s"] == pytest.approx(0.050)
    assert _by_gpu(run, "tiny", 10)["prune"] == "memory"
    assert run.sims_run == sum(u.get("sims", 0) for u in run.units) > 0
    with open(tmp_path / "out" / "plan.csv", newline="") as f:
        first = next(csv.DictReader(f))
    assert (first["rank"], first["point"], first["answer"]) == ("1", cheap["point"], "True")
    assert float(first["joules_per_output_token"]) == pytest.approx(7.0)
    assert json.loads((tmp_path / "out" / "plan.json").read_text())["pruned"] == {
        "memory": 2, "tpot": 2
    }  # fmt: skip


def test_resume_reuses_every_finished_search(tmp_path):
    spec = read_plan(_write(tmp_path, TINY))
    first = plan(spec, tmp_path / "out")
    again = plan(spec, tmp_path / "out", resume=True)
    assert again.sims_run == 0 and again.sims_reused == first.sims_run
    assert again.answer["point"] == first.answer["point"]
    assert all(u.get("resumed") for u in again.units if u["status"] == "sized")
    # without --resume everything runs again; with changed inputs nothing is reused
    assert plan(spec, tmp_path / "out").sims_run == first.sims_run
    changed = {**TINY, "target_rate_per_s": 25}
    assert plan(read_plan(_write(tmp_path, changed)), tmp_path / "out", resume=True).sims_run > 0


def test_plan_command_prints_the_answer_and_writes_table_and_plot(tmp_path, capsys):
    code = main(["plan", str(_write(tmp_path, TINY)), "--out", str(tmp_path / "o"), "--quiet",
                 "--jobs", "2"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "answer: " in out and "4 x 1 cheap = 4 GPUs, $4.00/h" in out
    assert "pruned without simulating 2 (do not fit in memory) + 2 (TPOT" in out
    assert "simulations: " in out and "energy: J/tok is joules per output token" in out
    assert "7 J per output token (tdp_estimate)" in out
    assert (tmp_path / "o" / "pareto.png").stat().st_size > 0


@pytest.mark.parametrize(
    "change, key",
    [
        ({"budget_usd": 10}, "budget_usd"),
        ({"slo": {"ttft_p95_ms": 500, "tpot_p95_ms": 30, "ttft_p99_ms": 9}}, "slo.ttft_p99_ms"),
        ({"space": {"cluster.replicas": [1, 2]}}, "space.cluster.replicas"),
        ({"space": {"hardware.tp": 2}}, "space.hardware.tp"),
        ({"search": {"max_request": 5}}, "search.max_request"),
        ({"target_rate_per_s": 0}, "target_rate_per_s"),
    ],
)
def test_bad_plan_file_names_the_file_and_key(tmp_path, change, key):
    path = _write(tmp_path, {**TINY, **change})
    with pytest.raises(ConfigError) as e:
        read_plan(path)
    assert e.value.where == str(path) and e.value.key == key


def test_a_mistake_inside_the_space_stops_the_plan(tmp_path):
    path = _write(tmp_path, {**TINY, "space": {"scheduler.policy": ["no_such_policy"]}})
    with pytest.raises(ConfigError) as e:
        plan(read_plan(path), tmp_path / "out")
    assert e.value.key == "scheduler.policy"


def test_scaling_a_disaggregated_unit_multiplies_both_pools():
    unit = {"cluster": {"mode": "disaggregated", "prefill": {"replicas": 1},
                        "decode": {"replicas": 2}},
            "workload": {"arrival": {"rate_per_s": 1}, "limits": {"max_requests": 10}}}  # fmt: skip
    cfg = scaled_config(unit, 3, 50.0, 30)
    assert cfg["cluster"]["prefill"]["replicas"] == 3 and cfg["cluster"]["decode"]["replicas"] == 6
    assert cfg["workload"]["arrival"]["rate_per_s"] == 50.0
    assert unit["cluster"]["decode"]["replicas"] == 2  # the unit itself is left as it was


def test_units_given_the_roofline_by_latency_auto_say_why():
    fp8 = {"latency_model": "roofline", "precision": "fp8", "gpu": "h100-sxm", "tp": 4}
    assert fallback_warnings({}, fp8) == [
        "h100-sxm fp8 units use the roofline model: no table is shipped for this GPU, model, TP "
        "and precision"
    ]
    bf16 = {**fp8, "precision": "bf16"}
    assert "h100-sxm bf16 units" in fallback_warnings({"latency": {}}, bf16)[0]
    assert fallback_warnings({"latency": {"model": "roofline"}}, fp8) == []  # asked for it
    assert fallback_warnings({}, {**fp8, "latency_model": "profile"}) == []


def test_long_point_names_still_make_valid_record_files():
    short, long_a, long_b = "gpu=h200,tp=2", "x" * 300 + "a", "x" * 300 + "b"
    assert record_file(short) == "gpu=h200,tp=2.json"
    assert len(record_file(long_a)) < 255 and record_file(long_a) != record_file(long_b)


def test_energy_breaks_ties_in_cost():
    """Energy is the plan's second objective: at equal $/hour fewer joules per output token
    ranks first (before p95 TTFT), and an unknown energy ranks after the known ones."""
    from simulator.planner import rank

    def unit(point, usd, joules, ttft):
        return {"status": "sized", "point": point, "usd_per_hour": usd,
                "joules_per_output_token": joules, "ttft_p95_s": ttft}  # fmt: skip

    units = [unit("a", 36.0, 0.9, 0.1), unit("b", 36.0, 0.5, 0.4), unit("c", 36.0, None, 0.05),
             unit("d", 30.0, 2.0, 0.9), {"status": "infeasible", "point": "e"}]  # fmt: skip
    assert [u["point"] for u in rank(units)] == ["d", "b", "a", "c"]
