"""Expert parallelism timed through the engine (issue 15, item 3): which table an
expert-parallel run gets, the refusals of a table of another expert layout, and the profiling
job's and table build's side (pure Python; the shipped Qwen3-30B-A3B TP2 / EP2 tables)."""

from __future__ import annotations

import pytest

from profiles.engine_jobs import engine_job
from profiles.vllm_table import _check_expert_parallel
from simulator.errors import ConfigError
from simulator.latency.engine_steps import TOKEN_KNOTS, eager_jump_shows, token_knots
from simulator.models import MODELS
from simulator.runner import build
from tests.helpers import tiny_config

TP2 = "profiles/h200/vllm-0.24/qwen3-30b-a3b_tp2"


def _config(ep, latency: dict) -> dict:
    hw = {"gpu": "h200", "tp": 2, "expert_parallel": ep}
    return tiny_config("qwen3-30b-a3b", hw, latency, policy="vllm")


@pytest.mark.parametrize(
    "ep,table", [(False, "qwen3-30b-a3b_tp2"), (True, "qwen3-30b-a3b_tp2_ep2")]
)
def test_auto_picks_the_table_of_the_run_s_expert_layout(tmp_path, ep, table):
    for kind in ("auto", "profile"):
        lat = build(_config(ep, {"model": kind}), "exp.yaml", tmp_path).latency
        assert lat.name == f"engine:vllm-0.24.0/h200/{table}"
        assert lat.routing is not None  # the MoE routing check ran against its layout's bound


def test_all_to_all_has_no_table(tmp_path):
    lat = build(_config("all_to_all", {"model": "auto"}), "exp.yaml", tmp_path).latency
    assert lat.describe()["kind"] == "roofline"
    with pytest.raises(ConfigError, match="only with data parallelism") as e:
        build(_config("all_to_all", {"model": "profile"}), "exp.yaml", tmp_path)
    assert (e.value.where, e.value.key) == ("exp.yaml", "latency.model")


def test_a_table_of_another_expert_layout_is_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match="measured experts split over TP") as e:
        build(_config(True, {"model": "auto", "table": TP2}), "exp.yaml", tmp_path)
    assert (e.value.where, e.value.key) == ("exp.yaml", "latency.table")
    with pytest.raises(ConfigError, match=r"measured expert parallelism \(allreduce\)"):
        build(_config(False, {"model": "auto", "table": TP2 + "_ep2"}), "exp.yaml", tmp_path)


def test_engine_job_enables_vllm_expert_parallelism():
    spec = MODELS["qwen3-30b-a3b"]
    job = engine_job(spec, "m", 2, expert_parallel=True)
    assert job["engine"] == {"enable_expert_parallel": True}
    assert job["expert_parallel"] == "allreduce" and job["tp"] == 2
    assert "engine" not in engine_job(spec, "m", 2)
    with pytest.raises(ConfigError, match="tp >= 2"):
        engine_job(spec, "m", 1, expert_parallel=True)
    with pytest.raises(ConfigError, match="dense model"):
        engine_job(MODELS["llama-3-8b"], "m", 2, expert_parallel=True)
    with pytest.raises(ConfigError, match="shard"):
        engine_job(spec, "m", 2, shard=True, expert_parallel=True)


def test_table_build_refuses_a_run_of_another_expert_layout(tmp_path):
    ep_run = {"parallel": {"enable_expert_parallel": True, "data_parallel_size": 1}}
    _check_expert_parallel(tmp_path, ep_run, "allreduce")
    _check_expert_parallel(tmp_path, {}, None)  # recorded before engine.json kept `parallel`
    with pytest.raises(ConfigError, match="ran expert parallelism") as e:
        _check_expert_parallel(tmp_path, ep_run, None)
    assert e.value.key == "parallel.enable_expert_parallel"
    with pytest.raises(ConfigError, match="split experts over TP"):
        _check_expert_parallel(tmp_path, {}, "allreduce")
    dp = {"parallel": {"enable_expert_parallel": True, "data_parallel_size": 2}}
    with pytest.raises(ConfigError, match="data parallelism 1"):
        _check_expert_parallel(tmp_path, dp, "allreduce")


def _row(tokens: int, dur_us: float, split: str = "train") -> dict:
    return {"split": split, "prefill_tokens": tokens - 8, "decode_seqs": 8, "burst": 0,
            "dur_us": dur_us}  # fmt: skip


def test_eager_jump_knots_only_where_the_training_steps_jump():
    below = [_row(n, 15_000) for n in (400, 450, 512)]
    assert eager_jump_shows(below + [_row(n, 22_500) for n in (513, 600, 640)], 512)
    assert not eager_jump_shows(below + [_row(n, 22_000) for n in (513, 600, 640)], 512)
    # too few steps in a band, or the jump only in held-out steps: no jump
    assert not eager_jump_shows(below + [_row(n, 80_000) for n in (513, 600)], 512)
    held = [_row(n, 80_000, "test") for n in (513, 600, 640)]
    assert not eager_jump_shows(below + held, 512)
    assert token_knots(512, False) == TOKEN_KNOTS
    assert token_knots(512, True) == (1, 256, 512, 513, 1024, 4096, 8192, 16384)
    assert token_knots(0, True) == TOKEN_KNOTS
