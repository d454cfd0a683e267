"""`validation/vllm-0.24/repeatability.py`: a shipped table judged on another profiling run of
the same engine, at the layout that run served (CPU, stored runs; a few seconds each)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from simulator.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
VALIDATION = ROOT / "validation" / "vllm-0.24"
TP2_RUN = VALIDATION / "repeat_h200_qwen3-30b-a3b_tp2_host1"  # the first host's TP2 run
TABLES = ROOT / "profiles" / "h200" / "vllm-0.24"


def _repeatability():
    spec = importlib.util.spec_from_file_location("repeatability", VALIDATION / "repeatability.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_tp2_run_is_judged_at_tp2():
    """The run's TP comes from its job (`engine.json` -> `job.tp`): before, every run was built
    as TP1 and a TP2 run was refused. The two hosts' TP2 tables agree on CUDA-graph decode steps
    within 1%, so the median over the other run's steps stays within the 5% floor."""
    out = _repeatability().cross_run(
        TP2_RUN, TABLES / "qwen3-30b-a3b_tp2", "qwen3-30b-a3b", "h200", served_bf16=False
    )
    other = out["table on every usable step of the other run"]
    assert other["all"]["steps"] == other["decode_only"]["steps"] + other["with_prefill"]["steps"]
    assert other["all"]["steps"] > 5000  # every usable step of two passes, not a sample
    assert 0.0 < other["all"]["median"] < 0.05
    assert out["table's own held-out steps"]["all"]["steps"] > 0


def test_a_tp2_run_is_refused_by_a_tp1_table():
    with pytest.raises(ConfigError, match="tp"):
        _repeatability().cross_run(
            TP2_RUN, TABLES / "qwen3-30b-a3b_tp1", "qwen3-30b-a3b", "h200", served_bf16=False
        )
