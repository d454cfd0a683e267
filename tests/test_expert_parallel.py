"""Expert parallelism (issue 15, item 3): weights, loads and collectives by hand.

Every expected figure below is written out from the model's config.json numbers (Qwen3-30B-A3B:
48 layers, hidden 2048, 128 experts of width 768, top-8; Mixtral-8x7B: 32 layers, hidden 4096,
8 experts of width 14336, top-2), bf16 (2 bytes), tp = ep = 2.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.errors import ConfigError
from simulator.hardware import GPUS
from simulator.latency.roofline import RooflineLatencyModel
from simulator.models import MODELS
from simulator.runner import build
from simulator.served import (
    ShardedModel,
    collective_link_bytes,
    ep_expert_tokens,
    ep_experts_touched,
    expected_max_normal,
)
from tests.helpers import tiny_config

#: name -> (layers, hidden, experts, expert width, top_k)
SHAPES = {"qwen3-30b-a3b": (48, 2048, 128, 768, 8), "mixtral-8x7b": (32, 4096, 8, 14336, 2)}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_weights_per_gpu_by_hand(name):
    """EP: E/2 whole experts per GPU plus half of everything else; equal to TP's share."""
    layers, h, e, inter, _ = SHAPES[name]
    expert = 3 * h * inter * 2  # gate, up, down in bf16
    routed = layers * e * expert
    assert routed == {"qwen3-30b-a3b": 57_982_058_496, "mixtral-8x7b": 90_194_313_216}[name]
    tp, ep = ShardedModel(MODELS[name], 2), ShardedModel(MODELS[name], 2, "allreduce")
    assert ep.routed_expert_bytes == routed
    assert ep.weight_bytes_per_gpu == (ep.weight_bytes - routed) / 2 + layers * (e // 2) * expert
    assert ep.weight_bytes_per_gpu == tp.weight_bytes_per_gpu  # KV capacity is unchanged
    gate_up = ep.op("experts_gate_up")
    assert (gate_up.shape, gate_up.experts, gate_up.ep) == ((2 * inter, h), e // 2, 2)
    assert gate_up.weight_bytes == (e // 2) * 2 * inter * h * 2
    # expected FLOPs per GPU and step token are TP's: k/ep whole experts = k experts at 1/tp
    assert gate_up.flops_per_token == tp.op("experts_gate_up").flops_per_token
    assert ep.linear_flops_per_token == tp.linear_flops_per_token


def test_expert_tokens_per_gpu_by_hand():
    """Qwen3 at 64 tokens: mean 64 x 8 / 2 = 256 copies per GPU; Var - Cov = 64 x 8 x 120 /
    (2 x 127); the busiest of 2 GPUs is sqrt(that) / sqrt(pi) above the mean."""
    mean, most = ep_expert_tokens(128, 8, 2, 64)
    assert mean == 256
    assert most == pytest.approx(256 + math.sqrt(64 * 8 * 120 / (2 * 127)) / math.sqrt(math.pi))
    assert most == pytest.approx(264.775, abs=1e-3)
    # Mixtral, one token: 1 + sqrt(2 x 6 / (2 x 7)) / sqrt(pi) = 1.522 (the exact expectation is
    # 10/7 = 1.429: the normal approximation is 7% high at one token, < 1% from 4 tokens)
    assert ep_expert_tokens(8, 2, 2, 1) == pytest.approx((1.0, 1 + math.sqrt(6 / 7 / math.pi)))
    assert ep_expert_tokens(8, 2, 2, 0) == (0.0, 0.0)
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-9)
    assert expected_max_normal(1) == 0.0


def test_touched_per_gpu_mean_is_tp_share():
    """The mean distinct experts one GPU touches is `expected_experts_touched` / ep, so TP and EP
    read the same expected weight bytes; the busiest GPU is what EP adds. All 64 once saturated."""
    for t in (1, 8, 64):
        mean, most = ep_experts_touched(128, 8, 2, t)
        assert mean == pytest.approx(64 * (1 - (1 - 8 / 128) ** t))
        assert mean <= most <= 64
    assert ep_experts_touched(128, 8, 2, 4096)[1] == pytest.approx(64)


@pytest.mark.parametrize("e,k,ep", [(8, 2, 2), (128, 8, 2), (128, 8, 4)])
def test_busiest_gpu_against_simulated_routing(e, k, ep):
    """The normal approximation against routed tokens (each picks k distinct experts)."""
    rng = np.random.default_rng(1)
    m = e // ep
    for t, tol in ((1, 0.08), (4, 0.03), (64, 0.01)):
        tok, touched = [], []
        for _ in range(3000):
            chosen = np.argsort(rng.random((t, e)), axis=1)[:, :k]
            gpu = chosen // m
            tok.append(max((gpu == g).sum() for g in range(ep)))
            touched.append(max(len(np.unique(chosen[gpu == g])) for g in range(ep)))
        assert ep_expert_tokens(e, k, ep, t)[1] == pytest.approx(np.mean(tok), rel=tol)
        assert ep_experts_touched(e, k, ep, t)[1] == pytest.approx(np.mean(touched), rel=tol)


def test_all_to_all_bytes_by_hand():
    """Per MoE layer and step token one GPU sends (dispatch; combine the same back): it owns
    1/2 of the tokens and sends each once to the other GPU when that GPU holds one of its k
    experts: Mixtral 1 - C(4,2)/C(8,2) = 22/28; Qwen3 1 - C(64,8)/C(128,8). All-gather: half the
    8192-byte hidden vector (Mixtral) arrives. Without deduplication (T x k x hidden over the
    group) Mixtral would send 8192 x 2 / 2 / 2 = 4096 bytes per token, not 3218."""
    mix = ShardedModel(MODELS["mixtral-8x7b"], 2, "all_to_all")
    assert collective_link_bytes(mix.op("ep_dispatch"), 2) == pytest.approx(8192 * 22 / 28 / 2)
    assert collective_link_bytes(mix.op("ep_combine"), 2) == pytest.approx(3218.2857, rel=1e-6)
    assert collective_link_bytes(mix.op("ep_allgather"), 2) == 4096
    assert mix.op("allreduce").count == 1  # attention only: no dense layers, no shared experts
    assert mix.op("ep_dispatch").layers == 32
    qwen = ShardedModel(MODELS["qwen3-30b-a3b"], 2, "all_to_all")
    none = math.prod((64 - i) / (128 - i) for i in range(8))
    assert collective_link_bytes(qwen.op("ep_dispatch"), 2) == pytest.approx(4096 * (1 - none) / 2)
    # vLLM at DP 1 keeps TP's two all-reduces per layer and no all-to-all
    ar = ShardedModel(MODELS["qwen3-30b-a3b"], 2, "allreduce")
    assert [o.name for o in ar.ops if o.kind == "collective"] == ["allreduce"]
    assert ar.op("allreduce").count == 2


def test_deepseek_all_to_all_keeps_the_mlp_all_reduce():
    """Shared experts stay TP-split (as vLLM places them), so their all-reduce runs in every
    layer; DeepSeek-V2-Lite's first dense layer is covered by the same op."""
    ds = ShardedModel(MODELS["deepseek-v2-lite"], 2, "all_to_all")
    assert ds.op("allreduce_mlp").layers == 0 and ds.op("ep_combine").layers == 26
    assert ds.op("shared_gate_up").shape == (2 * 2 * (1408 // 2), 2048)  # 2 shared, half width


def _steps(name: str, mode):
    r = RooflineLatencyModel(MODELS[name], GPUS["h200"], 2, expert_parallel=mode)
    decode = {b: r.step_time(0, 0, 0, b, b * 1024) for b in (1, 64, 256)}
    return r, decode, r.step_time(8192, 8192 * 8193 / 2, 1, 0, 0)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_tp_vs_ep_roofline(name):
    """What the roofline implies on 2 GPUs (uniform routing):

    * batch 1: TP reads a half-slice of each of the k touched experts on both GPUs; EP's GPUs
      read whole experts, split unevenly (Mixtral: 0, 1 or 2 of a token's 2), and the step
      waits for the busier GPU: EP is slower (decode at small batch is weight-bound).
    * large batch: every expert is touched on both layouts (equal weight bytes); EP reads each
      token's hidden vector only on the GPUs holding its experts instead of k times on every
      GPU, and its load imbalance shrinks as 1/sqrt(T): EP within 2% of TP.
    * all_to_all moves more bytes than the all-reduce on 2 GPUs (dispatch + combine +
      all-gather), so it is never faster than vLLM's DP-1 layout here.
    """
    _, tp, tp_pre = _steps(name, None)
    r, ep, ep_pre = _steps(name, "allreduce")
    _, a2a, a2a_pre = _steps(name, "all_to_all")
    assert ep[1] > tp[1] * 1.04
    assert ep[256] == pytest.approx(tp[256], rel=0.02)
    assert all(a2a[b] > ep[b] for b in ep) and a2a_pre > ep_pre
    assert ep_pre == pytest.approx(tp_pre, rel=0.02)
    parts = r.breakdown(0, 0, 0, 64, 64 * 1024)
    tp_parts = RooflineLatencyModel(MODELS[name], GPUS["h200"], 2).breakdown(0, 0, 0, 64, 65536)
    assert parts["expert_comm"] == 0 and parts["allreduce"] == tp_parts["allreduce"]


def test_describe_flags_the_estimate():
    r = RooflineLatencyModel(MODELS["mixtral-8x7b"], GPUS["h200"], 2, expert_parallel="all_to_all")
    d = r.describe()
    assert d["expert_parallel"] == "all_to_all"
    assert any("expert-parallel all-to-all estimated from link bandwidth, not measured" in w
               for w in d["warnings"])  # fmt: skip
    ar = RooflineLatencyModel(MODELS["mixtral-8x7b"], GPUS["h200"], 2, expert_parallel="allreduce")
    assert any("not measured" in w for w in ar.describe()["warnings"])
    assert "expert_parallel" not in RooflineLatencyModel(MODELS["mixtral-8x7b"], GPUS["h200"],
                                                         2).describe()  # fmt: skip
    with pytest.raises(ValueError, match="skew with all_to_all"):
        RooflineLatencyModel(MODELS["mixtral-8x7b"], GPUS["h200"], 2, moe_routing_skew=1.0,
                             expert_parallel="all_to_all")  # fmt: skip


def _config(model: str, tp: int, ep, latency="roofline") -> dict:
    hw = {"gpu": "h200", "tp": tp, "expert_parallel": ep}
    return tiny_config(model, hw, {"model": latency})


@pytest.mark.parametrize(
    "model,tp,ep,latency,match",
    [
        ("llama-3-8b", 2, True, "roofline", "dense model"),
        ("mixtral-8x7b", 1, True, "roofline", "tp >= 2"),
        ("mixtral-8x7b", 2, "yes", "roofline", "expected false, true"),
        ("mixtral-8x7b", 2, True, "profile", "no profiled table measured expert parallelism"),
    ],
)
def test_config_errors_name_file_and_field(tmp_path, model, tp, ep, latency, match):
    with pytest.raises(ConfigError, match=match) as e:
        build(_config(model, tp, ep, latency), "exp.yaml", tmp_path)
    assert e.value.where == "exp.yaml"
    key = "latency.model" if latency == "profile" else "hardware.expert_parallel"
    assert e.value.key == key


def test_ep_run_resolves_and_warns(tmp_path):
    built = build(_config("mixtral-8x7b", 2, "all_to_all", "auto"), "exp.yaml", tmp_path)
    assert built.resolved["hardware"]["expert_parallel"] == "all_to_all"
    assert built.resolved["latency"]["expert_parallel"] == "all_to_all"
    off = build(_config("mixtral-8x7b", 2, False), "exp.yaml", tmp_path)
    assert "expert_parallel" not in off.resolved["hardware"]
