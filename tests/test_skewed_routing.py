"""Skewed routing timed through the engine (issue 15, item 3): the calibration that makes dummy
routers route as `simulator.served.routing_probabilities` says, its linear algebra, a dummy
model routed with it (needs torch: CI installs its CPU build), and which table a skewed model
gets (the shipped Qwen3-30B-A3B TP1 tables, uniform and skew 0.6)."""

from __future__ import annotations

import numpy as np
import pytest

from profiles.engine_jobs import engine_job
from profiles.hf_config import hf_config
from profiles.routing_skew import (
    check_skewable,
    offset_router,
    skew_offsets,
    skew_plan,
    summarize_routing,
    topk_shares,
)
from profiles.vllm_table import _check_routing_skew
from simulator.errors import ConfigError
from simulator.latency.select import table_folder
from simulator.models import MODELS, load_model, with_routing_skew
from simulator.runner import build
from simulator.served import expected_experts_touched, routing_imbalance, routing_probabilities
from tests.helpers import tiny_config

QWEN3 = MODELS["qwen3-30b-a3b"]
SKEWED = {"base": "qwen3-30b-a3b", "routing_skew": 0.6}


def _fresh_tops(offsets: np.ndarray, top_k: int, tokens: int = 40_000) -> np.ndarray:
    """top-k expert ids of ``tokens`` fresh N(0, 1) token logits plus ``offsets`` (another seed
    than the calibration's: the check is out of sample)."""
    z = np.random.default_rng(12345).standard_normal((tokens, offsets.size)) + offsets
    return np.argpartition(-z, top_k - 1, axis=1)[:, :top_k]


@pytest.mark.parametrize("experts, top_k, skew", [(128, 8, 0.6), (8, 2, 0.6), (32, 4, 1.0)])
def test_calibrated_offsets_route_as_the_simulator_assumes(experts, top_k, skew):
    b = skew_offsets(experts, top_k, skew)
    assert np.array_equal(b, skew_offsets(experts, top_k, skew))  # seeded: the same offsets
    assert abs(b.mean()) < 1e-9
    tops = _fresh_tops(b, top_k)
    shares = np.bincount(tops.ravel(), minlength=experts) / tops.shape[0]
    target = np.asarray(routing_probabilities(experts, top_k, skew))
    rel = np.abs(shares / target - 1)
    # sampling noise of 32k calibration + 40k check tokens: ~4% for the coldest of 128
    assert np.median(rel) < 0.03 and rel.max() < 0.12
    seen = summarize_routing([tops], experts, top_k)
    assert seen["max_over_mean"] == pytest.approx(routing_imbalance(experts, top_k, skew), rel=0.03)
    for t in (8, 64):
        want = expected_experts_touched(experts, top_k, t, skew)
        assert seen["touched"][str(t)] == pytest.approx(want, rel=0.02)


def test_topk_shares_count_each_tokens_top_k_once():
    logits = np.array([[3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 5.0, 4.0]])
    assert topk_shares(logits, 2).tolist() == [0.5, 0.5, 0.5, 0.5]
    assert topk_shares(logits, 1).tolist() == [0.5, 0.0, 0.5, 0.0]


def test_offset_router_adds_the_offsets_along_u_and_nothing_across_it():
    rng = np.random.default_rng(0)
    w, u, b = rng.standard_normal((6, 10)), rng.standard_normal(10), rng.standard_normal(6)
    w2 = offset_router(w, u, b)
    np.testing.assert_allclose(w2 @ u, b, atol=1e-12)  # the constant part gives the offsets
    v = rng.standard_normal(10)
    v -= (v @ u) / (u @ u) * u  # a token's own part, orthogonal to u
    np.testing.assert_allclose(w2 @ v, w @ v, atol=1e-12)


def test_grouped_sigmoid_routers_cannot_be_skewed():
    check_skewable(hf_config(QWEN3))
    check_skewable(hf_config(MODELS["deepseek-v2-lite"]))  # softmax over one group
    with pytest.raises(ValueError, match="scoring_func, n_group"):
        check_skewable(hf_config(MODELS["deepseek-v3"]))


def _dummy_model(torch, hidden=512, experts=128, layers=3, vocab=4000):
    """vLLM's names, dummy values (+-1e-3) and bf16: an embedding, and per layer a
    post-attention norm feeding a router of ``experts`` rows."""
    nn = torch.nn
    model = nn.Module()
    model.model = nn.Module()
    model.model.embed_tokens = nn.Embedding(vocab, hidden).to(torch.bfloat16)
    nn.init.uniform_(model.model.embed_tokens.weight, -1e-3, 1e-3)
    model.model.layers = nn.ModuleList()
    for _ in range(layers):
        layer = nn.Module()
        layer.post_attention_layernorm = nn.Module()
        norm = torch.empty(hidden).uniform_(-1e-3, 1e-3).to(torch.bfloat16)
        layer.post_attention_layernorm.weight = nn.Parameter(norm)
        layer.mlp = nn.Module()
        layer.mlp.gate = nn.Linear(hidden, experts, bias=False).to(torch.bfloat16)
        model.model.layers.append(layer)
    return model


@pytest.mark.parametrize("skew", [0.0, 0.6])
def test_a_dummy_model_routes_random_tokens_as_asked(skew):
    torch = pytest.importorskip("torch")
    from profiles.dummy_routing import reinit_routers, routing_at_load, spread_embeddings

    torch.manual_seed(0)
    model = _dummy_model(torch)
    cfg = {"num_experts": 128, "num_experts_per_tok": 8, "hidden_size": 512}
    plan = skew_plan(cfg, skew) if skew else None
    reinit_routers(model, 128, seed=0, skew=plan)
    spread_embeddings(model, seed=0, skew=plan)
    seen = routing_at_load(model, 128, 8, tokens=8192)
    assert seen["routers"] == 3
    for t in (8, 64):  # bf16 weights, per-channel norm weights: still as calibrated
        want = expected_experts_touched(128, 8, t, skew)
        assert seen["touched"][str(t)] == pytest.approx(want, rel=0.02)
    if skew:
        assert seen["max_over_mean"] == pytest.approx(routing_imbalance(128, 8, skew), rel=0.04)
    else:  # uniform: the max over 128 experts of ~512 tokens each is sampling noise only
        assert 1.0 < seen["max_over_mean"] < 1.3


def test_a_skewed_model_gets_the_table_of_its_skew(tmp_path):
    hw = {"gpu": "h200", "tp": 1}
    for kind in ("auto", "profile"):
        cfg = tiny_config(SKEWED, hw, {"model": kind}, policy="vllm")
        lat = build(cfg, "exp.yaml", tmp_path).latency
        assert lat.name == "engine:vllm-0.24.0/h200/qwen3-30b-a3b_skew0.6_tp1"
        assert not lat.routing["concentrated"]  # checked against the skewed bound
    uniform = build(tiny_config("qwen3-30b-a3b", hw, {"model": "auto"}, policy="vllm"),
                    "exp.yaml", tmp_path).latency  # fmt: skip
    assert uniform.name == "engine:vllm-0.24.0/h200/qwen3-30b-a3b_tp1"


def test_a_table_of_another_skew_is_never_used(tmp_path):
    hw = {"gpu": "h200", "tp": 1}
    other = {"base": "qwen3-30b-a3b", "routing_skew": 0.3}  # no table: the uniform one is refused
    lat = build(tiny_config(other, hw, {"model": "auto"}, policy="vllm"), "exp.yaml",
                tmp_path).latency  # fmt: skip
    assert lat.describe()["kind"] == "roofline"
    assert "uniform routing" in lat.fallback_reason and "skewed 0.3" in lat.fallback_reason
    with pytest.raises(ConfigError, match="timed uniform routing") as e:
        build(tiny_config(other, hw, {"model": "profile"}, policy="vllm"), "exp.yaml", tmp_path)
    assert e.value.key == "latency.model"
    named = {"model": "auto", "table": "profiles/h200/vllm-0.24/qwen3-30b-a3b_skew0.6_tp1"}
    with pytest.raises(ConfigError, match=r"timed routing skewed 0.6 \(Zipf\)") as e:
        build(tiny_config("qwen3-30b-a3b", hw, named, policy="vllm"), "exp.yaml", tmp_path)
    assert e.value.key == "latency.table"


def test_the_profiling_side_carries_the_skew():
    skewed = load_model(SKEWED, "t", "model")
    assert table_folder(skewed, 1) == "qwen3-30b-a3b_skew0.6_tp1"
    assert table_folder(QWEN3, 2, "allreduce") == "qwen3-30b-a3b_tp2_ep2"
    assert engine_job(skewed, "m", 1)["routing_skew"] == 0.6
    assert "routing_skew" not in engine_job(QWEN3, "m", 1)
    assert with_routing_skew(QWEN3, 0.6, "<cli>", "--routing-skew") == skewed
    with pytest.raises(ConfigError, match="dense model") as e:
        with_routing_skew(MODELS["llama-3-8b"], 0.6, "<cli>", "--routing-skew")
    assert e.value.key == "--routing-skew"
    with pytest.raises(ConfigError, match="Zipf exponent >= 0"):
        with_routing_skew(QWEN3, float("nan"), "<cli>", "--routing-skew")


def test_a_router_that_cannot_be_skewed_is_refused_before_any_gpu_work(tmp_path):
    from profiles.vllm_run import _load_format

    v3 = load_model({"base": "deepseek-v3", "routing_skew": 0.6}, "t", "model")
    with pytest.raises(ConfigError, match="deepseek-v3: routing_skew needs") as e:
        engine_job(v3, "m", 8, shard=True)
    assert e.value.key == "routing_skew"
    job = {"model_dir": "m", "routing": "token_dependent", "routing_skew": 0.6}
    with pytest.raises(SystemExit, match="m/config.json: routing_skew needs"):
        _load_format(job, hf_config(v3), tmp_path / "r")
    with pytest.raises(SystemExit, match="routing_skew needs routing: token_dependent"):
        _load_format({"routing_skew": 0.6}, hf_config(QWEN3), tmp_path / "r")
    with pytest.raises(SystemExit, match="expected a Zipf exponent"):
        _load_format({**job, "routing_skew": "hot"}, hf_config(QWEN3), tmp_path / "r")


def test_table_build_refuses_a_run_of_another_skew(tmp_path):
    skewed = load_model(SKEWED, "t", "model")
    assert _check_routing_skew(tmp_path, {"routing_skew": 0.6}, skewed) == 0.6
    assert _check_routing_skew(tmp_path, {}, QWEN3) == 0.0  # recorded before the key existed
    with pytest.raises(ConfigError, match="routed with skew 0.6; the table is asked for skew 0"):
        _check_routing_skew(tmp_path, {"routing_skew": 0.6}, QWEN3)
    with pytest.raises(ConfigError, match="routed with skew 0;") as e:
        _check_routing_skew(tmp_path, {}, skewed)
    assert e.value.key == "routing_skew" and e.value.where.endswith("engine.json")
