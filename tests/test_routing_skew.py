"""Routing skew (issue 15: MoE expert work over realistic tokens-per-expert distributions).

``model.routing_skew`` is a Zipf exponent over the experts' popularity ranks; the default, 0, is
uniform routing and changes no figure. The sourced figure (`ROUTING_SKEW_SOURCE`): DeepSeek-R1's
router without EPLB, max/mean per-expert load 11.95 (NVIDIA TensorRT-LLM tech blog 4, Table 1).
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.errors import ConfigError
from simulator.models import MODELS, load_model
from simulator.served import (
    ROUTING_SKEW_SOURCE,
    expected_experts_touched,
    routing_imbalance,
    routing_probabilities,
)


def route(rng, p: np.ndarray, top_k: int, tokens: int, trials: int) -> np.ndarray:
    """Simulated routing: each token picks exactly ``top_k`` distinct experts, expert ``i``
    with probability ``p_i`` (systematic sampling, Madow 1949: one uniform offset, points
    ``u, u + 1, ..., u + k - 1`` on the cumulative ``p``), independently across tokens.
    Returns a (trials, tokens, top_k) array of expert ids."""
    edges = np.concatenate([[0.0], np.cumsum(p)])
    edges[-1] = top_k  # exact, so every point lands in an expert
    u = rng.random((trials, tokens, 1)) + np.arange(top_k)
    return np.searchsorted(edges, u, side="right") - 1


@pytest.mark.parametrize(
    ("experts", "top_k", "tokens", "skew"),
    [(8, 2, 1, 1.0), (8, 2, 6, 1.0), (8, 2, 6, 3.0), (64, 6, 5, 0.6), (256, 8, 16, 0.6),
     (128, 8, 3, 1.2)],
)  # fmt: skip
def test_distinct_experts_against_brute_force_routing(experts, top_k, tokens, skew):
    """The expected distinct experts (and the per-expert load) of simulated skewed routing,
    seeded, match the formula within sampling error."""
    p = np.array(routing_probabilities(experts, top_k, skew))
    assert p.sum() == pytest.approx(top_k) and (np.diff(p) <= 1e-12).all() and p.max() <= 1
    rng = np.random.default_rng(7)
    trials = 4000
    picks = route(rng, p, top_k, tokens, trials)
    assert (np.diff(np.sort(picks, axis=2), axis=2) > 0).all()  # k distinct experts a token
    touched = np.zeros((trials, experts), bool)
    np.put_along_axis(touched, picks.reshape(trials, -1), True, axis=1)
    brute = touched.sum(1).mean()
    assert expected_experts_touched(experts, top_k, tokens, skew) == pytest.approx(brute, rel=0.01)
    load = np.bincount(picks.ravel(), minlength=experts) / (trials * tokens)
    assert load == pytest.approx(p, abs=0.01)  # tokens per expert follow p
    uniform = expected_experts_touched(experts, top_k, tokens)
    skewed = expected_experts_touched(experts, top_k, tokens, skew)
    assert skewed < uniform if tokens > 1 else skewed == pytest.approx(uniform)  # 1 token: k


@pytest.mark.parametrize(("experts", "top_k"), [(8, 2), (128, 8), (256, 8), (64, 6)])
def test_zero_skew_is_the_uniform_formula(experts, top_k):
    assert routing_probabilities(experts, top_k, 0.0) == (top_k / experts,) * experts
    assert routing_imbalance(experts, top_k, 0.0) == 1.0
    for t in (0, 1, 3, 17, 256, 4096):
        uniform = experts * (1 - (1 - top_k / experts) ** t) if t else 0.0
        assert expected_experts_touched(experts, top_k, t) == uniform
        assert expected_experts_touched(experts, top_k, t, 0.0) == uniform
        # the skewed formula's limit at 0 is the same number
        assert expected_experts_touched(experts, top_k, t, 1e-9) == pytest.approx(uniform)


def test_routing_skew_reproduces_the_measured_imbalance():
    """DeepSeek-R1 (256 experts, top-8), TensorRT-LLM blog 4 Table 1: max/mean 1 + 10.948,
    std/mean 164.1 / 128 per layer and iteration. Zipf 0.595 gives the max/mean, 0.642 the
    std/mean; 0.6 is within 4% and 13% of them."""
    assert "TensorRT-LLM" in ROUTING_SKEW_SOURCE
    assert routing_imbalance(256, 8, 0.595) == pytest.approx(11.948, rel=1e-3)
    p = np.array(routing_probabilities(256, 8, 0.642))
    assert p.std() / p.mean() == pytest.approx(164.1 / 128, rel=2e-3)
    assert routing_imbalance(256, 8, 0.6) == pytest.approx(11.948, rel=0.04)
    p = np.array(routing_probabilities(256, 8, 0.6))
    assert p.std() / p.mean() == pytest.approx(164.1 / 128, rel=0.13)


def test_probabilities_capped_at_one():
    """A steep skew on few experts: the hottest expert is in every token's top-k (p = 1) and
    the excess goes to the rest, in proportion, so a token still picks k."""
    p = routing_probabilities(8, 2, 3.0)
    assert p[0] == 1.0 and sum(p) == pytest.approx(2.0)
    rest = [i**-3.0 for i in range(2, 9)]
    assert p[1:] == pytest.approx([x / sum(rest) for x in rest])


def test_routing_skew_config_key(tmp_path):
    m = load_model({"base": "qwen3-30b-a3b", "routing_skew": 0.6}, "e.yaml", "model")
    assert m.moe.routing_skew == 0.6 and m.resolved()["moe"]["routing_skew"] == 0.6
    # the default leaves resolved configs as they were (no key)
    assert "routing_skew" not in MODELS["qwen3-30b-a3b"].resolved()["moe"]
    with pytest.raises(ConfigError, match="dense model"):
        load_model({"base": "llama-3-8b", "routing_skew": 0.6}, "e.yaml", "model")
    with pytest.raises(ConfigError, match="routing_skew"):
        load_model({"base": "qwen3-30b-a3b", "routing_skew": -1}, "e.yaml", "model")
    import json

    from simulator.hf_catalog import HF_CONFIGS

    (tmp_path / "config.json").write_text(json.dumps(HF_CONFIGS["mixtral-8x7b"][1]))
    exp = tmp_path / "e.yaml"
    exp.write_text("")
    m = load_model({"config": "config.json", "routing_skew": 1.0}, str(exp), "model")
    assert m.moe.routing_skew == 1.0


def test_roofline_reads_fewer_expert_weights_with_skew():
    """Decode of 64 tokens on Qwen3-30B-A3B (128 experts, top-8): the step reads the weights of
    the expected distinct experts; skew 0.6 touches fewer, so the step is shorter; skew 0 is
    byte-identical to the model without the key."""
    import dataclasses

    from simulator.hardware import GPUS
    from simulator.latency.roofline import RooflineLatencyModel

    base = MODELS["qwen3-30b-a3b"]
    skewed = dataclasses.replace(base, moe=dataclasses.replace(base.moe, routing_skew=0.6))
    zero = dataclasses.replace(base, moe=dataclasses.replace(base.moe, routing_skew=0.0))
    gpu = GPUS["h200"]
    a, b, c = (RooflineLatencyModel(m, gpu) for m in (base, skewed, zero))
    feats = (0, 0.0, 0, 64, 64 * 1000)
    assert c.step_time(*feats) == a.step_time(*feats)
    assert b.step_time(*feats) < a.step_time(*feats)
    op = a.served.op("experts_gate_up")
    ratio = expected_experts_touched(128, 8, 64, 0.6) / expected_experts_touched(128, 8, 64)
    assert b._weight_read(op, 64) == pytest.approx(a._weight_read(op, 64) * ratio)


def test_routing_skew_refused_where_not_modelled():
    from tests.policy_kit import config, simulate_config

    model = {"base": "qwen3-30b-a3b", "routing_skew": 0.6}
    with pytest.raises(ConfigError, match="routing_skew with all_to_all is not modelled"):
        hw = {"gpu": "h200", "tp": 2, "expert_parallel": "all_to_all"}
        simulate_config(config(model=model, hardware=hw))
