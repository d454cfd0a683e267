"""``latency.launch_scale``: a vLLM table's launches charged at another host's level
(`EngineStepModel.scale_launches`), on the shipped tables (pure Python)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from simulator.errors import ConfigError
from simulator.latency.engine_steps import EngineStepModel
from simulator.runner import build, simulate
from tests.helpers import tiny_config

#: three engine processes with launches of both kinds (eager medians 64-85 ms by process)
THREE = "profiles/h100/vllm-0.24/deepseek-v2-lite_tp1"
#: one engine process
ONE = "profiles/h100/vllm-0.24/gpt-oss-20b_tp1"


@pytest.fixture(scope="module")
def fitted() -> EngineStepModel:
    """The three-process table, fitted once (tests scale copies of it)."""
    return EngineStepModel(THREE, "deepseek-v2-lite", 1)


def test_a_factor_multiplies_every_launch_time_of_both_kinds(fitted):
    base, scaled = fitted, copy.deepcopy(fitted)
    scaled.scale_launches(2.5)
    for tokens in (100, 3000):  # within the largest CUDA graph (512) and eager
        assert scaled.launch_s(tokens) == pytest.approx(2.5 * base.launch_s(tokens), rel=1e-12)
        for u in (0.0, 0.1, 0.5, 0.93, 1.0):
            want = 2.5 * base.launch_quantile_s(tokens, u)
            assert scaled.launch_quantile_s(tokens, u) == pytest.approx(want, rel=1e-12)
    assert scaled.describe()["launch_scale"] == {"asked": 2.5, "graph": 2.5, "eager": 2.5}
    assert "launch_scale" not in base.describe()


@pytest.mark.parametrize("how,pick", [("slowest", max), ("fastest", min)])
def test_slowest_and_fastest_take_the_level_of_one_engine_process(fitted, how, pick):
    """The table's launches sit at its processes' median level (`launches_across_processes`);
    ``slowest`` moves each kind's level to its slowest process's median (``fastest``: its
    fastest), keeping the spread within a process."""
    lat = copy.deepcopy(fitted)
    medians = {g: dict(m) for g, m in lat.launch_process_medians.items()}
    level = dict(lat.launch)
    lat.scale_launches(how)
    for g, kind in ((True, "graph"), (False, "eager")):
        assert len(medians[g]) == 3
        target = pick(medians[g].values())
        assert lat.launch[g] == pytest.approx(target, rel=1e-12)
        assert lat.launch_scale[kind] == pytest.approx(target / level[g], rel=1e-12)
    assert (lat.launch_scale["eager"] > 1) == (how == "slowest")


def test_slowest_needs_two_engine_processes_and_a_factor_must_be_positive():
    lat = EngineStepModel(ONE, "gpt-oss-20b", 1)
    with pytest.raises(ValueError, match="one engine process"):
        lat.scale_launches("slowest")
    for bad in (0, -1.0, "faster"):
        with pytest.raises(ValueError, match="a number > 0, slowest or fastest"):
            lat.scale_launches(bad)


def _vllm(latency: dict) -> dict:
    return tiny_config("llama-3-8b", {"gpu": "h100"}, latency, policy="vllm")


def test_the_config_option_reaches_the_table_and_is_refused_elsewhere(tmp_path):
    lat = build(_vllm({"model": "auto", "launch_scale": 1.5}), "exp.yaml", tmp_path).latency
    assert lat.describe()["launch_scale"]["eager"] == 1.5
    lat = build(_vllm({"model": "auto", "launch_scale": "slowest"}), "exp.yaml", tmp_path).latency
    assert lat.describe()["launch_scale"]["asked"] == "slowest"
    cases = [
        ({"model": "roofline", "launch_scale": 2}, "only a table measured through an engine"),
        ({"model": "constant", "step_ms": 5, "launch_scale": 2}, "only a table measured"),
        ({"model": "auto", "launch_scale": 0}, "a number > 0, slowest or fastest"),
        ({"model": "auto", "launch_scale": "fast"}, "a number > 0, slowest or fastest"),
        ({"model": "auto", "launch_scale": True}, "a number > 0, slowest or fastest"),
        ({"model": "auto", "launch_scale": float("inf")}, "a number > 0, slowest or fastest"),
    ]
    for latency, message in cases:
        with pytest.raises(ConfigError, match=message) as e:
            build(_vllm(latency), "exp.yaml", tmp_path)
        assert (e.value.where, e.value.key) == ("exp.yaml", "latency.launch_scale")
    one = {"model": "profile", "table": ONE, "launch_scale": "fastest"}
    cfg = tiny_config("gpt-oss-20b", {"gpu": "h100"}, one, policy="vllm")
    with pytest.raises(ConfigError, match="gpt-oss-20b_tp1: the table's launches come from one"):
        build(cfg, "exp.yaml", tmp_path)


def test_slower_launches_delay_first_tokens(tmp_path):
    """Launches are host time before a prompt step (the vLLM policy's rule 7): a host three
    times slower makes the wait for a first token longer on average; every request is still
    served."""
    cfg = _vllm({"model": "auto"})
    work = cfg["workload"]  # eager prompt steps (above the largest CUDA graph, 512 tokens)
    work["arrival"]["rate_per_s"], work["num_requests"] = 4.0, 120
    work["lengths"]["input"]["value"], work["lengths"]["output"]["value"] = 1500, 64
    runs = {}
    for scale in (1.0, 3.0):
        c = copy.deepcopy(cfg)
        c["latency"]["launch_scale"] = scale
        runs[scale] = simulate(build(c, "exp.yaml", tmp_path))
    ttft = {s: np.mean(r.requests["ttft_s"]) for s, r in runs.items()}
    assert ttft[3.0] > ttft[1.0]
    for r in runs.values():
        assert r.summary["requests"]["completed"] == 120
