"""The check of a mixture-of-experts table's decode steps against the uniform-routing bound
(`simulator.latency.routing_check`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simulator.hardware import load_gpu
from simulator.latency.engine_steps import EngineStepModel
from simulator.latency.routing_check import (
    BOUND_TERMS,
    MIN_BATCH,
    routing_bound,
    routing_check,
)
from simulator.models import load_model
from simulator.runner import build, simulate
from tests.test_engine_steps import _table, _truth

REPO = Path(__file__).resolve().parents[1]
H200 = load_gpu("h200", "t", "gpu")
QWEN3 = load_model("qwen3-30b-a3b", "t", "model")
BOUND = routing_bound(QWEN3, H200, 1)


def _bound(r) -> float:
    terms = BOUND.breakdown(0, 0.0, 0, r["decode_seqs"], r["decode_ctx"])
    return sum(terms[k] for k in BOUND_TERMS)


def _moe_table(tmp_path, factor: float) -> Path:
    """A Qwen3-30B-A3B table whose decode steps of MIN_BATCH+ sequences take ``factor`` x the
    uniform-routing bound (other steps: the test law)."""

    def truth(r):
        if r["prefill_tokens"] == 0 and r["decode_seqs"] >= MIN_BATCH:
            return factor * _bound(r)
        return _truth(r)

    return _table(tmp_path, model="qwen3-30b-a3b", truth=truth)


def test_the_bound_is_the_rooflines_work_terms_without_overhead_or_collectives():
    terms = BOUND.breakdown(0, 0.0, 0, 64, 64_000)
    assert _bound({"decode_seqs": 64, "decode_ctx": 64_000}) == pytest.approx(
        terms["gemm"] + terms["attention"] + terms["elementwise"] + terms["lm_head"]
    )
    # uniform routing: 64 tokens touch most of the 128 experts, so the bound is several times
    # one token's
    one = _bound({"decode_seqs": 1, "decode_ctx": 1000})
    assert _bound({"decode_seqs": 64, "decode_ctx": 64_000}) > 4 * one


@pytest.mark.parametrize("factor, flagged", [(1.3, False), (0.5, True)])
def test_steps_below_the_routing_bound_flag_the_table(tmp_path, factor, flagged):
    m = EngineStepModel(_moe_table(tmp_path, factor), "qwen3-30b-a3b", 1)
    check = routing_check(m.rows, BOUND)
    checked = [r for r in m.rows if not r["prefill_tokens"] and r["decode_seqs"] >= MIN_BATCH]
    assert check["decode_steps_checked"] == len(checked) > 50  # batches 1 and 3 are not checked
    assert check["share"] == (1.0 if flagged else 0.0)
    assert check["concentrated"] is flagged
    bands = check["median_ratio_by_batch"].values()
    assert all(v == pytest.approx(factor, rel=1e-6) for v in bands)


def _run(table: Path, model: str) -> dict:
    cfg = yaml.safe_load((REPO / "tests" / "bad_inputs" / "base.yaml").read_text())
    cfg.update(model=model, scheduler={"policy": "vllm"})
    cfg["latency"] = {"model": "profile", "table": str(table)}
    return simulate(build(cfg, "t.yaml", REPO)).summary["latency_model"]


def test_a_run_on_a_flagged_table_says_so_and_its_step_times_do_not_change(tmp_path):
    low, high = tmp_path / "low", tmp_path / "high"
    low.mkdir(), high.mkdir()
    flagged = _run(_moe_table(low, 0.5), "qwen3-30b-a3b")
    clean = _run(_moe_table(high, 1.3), "qwen3-30b-a3b")
    assert flagged["routing_check"]["concentrated"]
    assert any("faster than uniform expert routing" in w for w in flagged["warnings"])
    assert not clean["routing_check"]["concentrated"]
    assert not any("expert routing" in w for w in clean["warnings"])
    # a dense model's table is not checked
    assert "routing_check" not in _run(_table(tmp_path, model="llama-3-8b"), "llama-3-8b")


@pytest.mark.parametrize(
    "folder, model, gpu, flagged",
    [("h200/vllm-0.24/deepseek-v2-lite_tp1", "deepseek-v2-lite", "h200", False),
     ("h100/vllm-0.24/deepseek-v2-lite_tp1", "deepseek-v2-lite", "h100", False),
     ("h100/vllm-0.24/gpt-oss-20b_tp1", "gpt-oss-20b", "h100", False),
     ("h200/vllm-0.24/qwen3-30b-a3b_tp1", "qwen3-30b-a3b", "h200", False),
     ("h200/vllm-0.24/mixtral-8x7b_tp1", "mixtral-8x7b", "h200", False)],
)  # fmt: skip
def test_shipped_tables_route_token_dependently(folder, model, gpu, flagged):
    """Every shipped MoE table passes the check: DeepSeek-V2-Lite's and gpt-oss-20b's were
    re-recorded with token-dependent routing (`profiles.dummy_routing`; with vLLM's dummy
    routers 86% and 94% of their decode steps lay below the bound, now 0.6% and 0.8%); Qwen3
    and Mixtral route token-dependently even on dummy weights. The check's ability to flag a
    concentrated table is tested above on a synthetic one."""
    spec = load_model(model, "t", "model")
    m = EngineStepModel(REPO / "profiles" / folder, spec.name, 1)
    bound = routing_bound(spec, load_gpu(gpu, "t", "gpu"), 1)
    assert routing_check(m.rows, bound)["concentrated"] is flagged
