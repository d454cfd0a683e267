"""The busiest GPU of an expert-parallel group under a skewed router (`simulator.ep_skew`):
uniform routing's closed forms in the limit of no skew, a placement computed by hand, token-by-
token top-k routing, and the layouts that take it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from profiles.routing_skew import skew_offsets
from simulator.ep_skew import ep_skewed_tokens, ep_skewed_touched
from simulator.errors import ConfigError
from simulator.hardware import GPUS
from simulator.latency.roofline import RooflineLatencyModel
from simulator.models import MODELS, load_model
from simulator.served import ep_expert_tokens, ep_experts_touched, routing_probabilities


@pytest.mark.parametrize("experts, top_k, ep", [(128, 8, 2), (8, 2, 2), (256, 8, 8)])
def test_without_skew_it_is_uniform_routings_closed_form(experts, top_k, ep):
    # from 8 tokens; at 1-3 both are approximations (a normal there, independent binomials
    # here) and differ by up to 6% (8 experts top-2 on 2 GPUs, one token: exact 40/28 = 1.43,
    # normal 1.52, binomials 1.47)
    for tokens in (8, 50, 64, 700, 4096):
        mean, most = ep_skewed_tokens(experts, top_k, ep, 0.0, tokens)
        assert (mean, most) == pytest.approx(ep_expert_tokens(experts, top_k, ep, tokens), rel=0.03)
        got = ep_skewed_touched(experts, top_k, ep, 0.0, tokens)
        assert got == pytest.approx(ep_experts_touched(experts, top_k, ep, tokens), rel=0.03)


def test_many_tokens_load_the_gpu_holding_the_hot_experts():
    """4 experts, top-1, 2 GPUs: the 3 ways to pair the experts are equally likely, and with
    many tokens the busiest GPU carries the larger pair's share of them (exact by hand)."""
    p = routing_probabilities(4, 1, 1.0)  # 12/25, 6/25, 4/25, 3/25
    pairs = [((0, 1), (2, 3)), ((0, 2), (1, 3)), ((0, 3), (1, 2))]
    share = np.mean([max(sum(p[i] for i in a), sum(p[i] for i in b)) for a, b in pairs])
    assert share == pytest.approx((18 + 16 + 15) / 75)
    mean, most = ep_skewed_tokens(4, 1, 2, 1.0, 2**17)
    assert most / mean == pytest.approx(share * 2, rel=0.01)  # mean share 1/2; 512 placements


def test_it_matches_token_by_token_top_k_routing():
    """Brute force: random placements, each token's top-k of N(0, 1) logits plus the offsets
    that give the skewed inclusion probabilities (`profiles.routing_skew.skew_offsets`)."""
    experts, k, ep, skew = 16, 2, 4, 0.8
    b = skew_offsets(experts, k, skew)
    rng = np.random.default_rng(7)
    for tokens in (4, 32, 256):
        loads, touched = [], []
        for _ in range(800):
            gpu_of = rng.permutation(experts) // (experts // ep)  # expert -> GPU
            z = rng.standard_normal((tokens, experts)) + b
            top = np.argpartition(-z, k - 1, axis=1)[:, :k]
            counts = np.bincount(top.ravel(), minlength=experts)
            loads.append(max(counts[gpu_of == g].sum() for g in range(ep)))
            touched.append(max((counts[gpu_of == g] > 0).sum() for g in range(ep)))
        assert ep_skewed_tokens(experts, k, ep, skew, tokens)[1] == pytest.approx(
            np.mean(loads), rel=0.04
        )
        assert ep_skewed_touched(experts, k, ep, skew, tokens)[1] == pytest.approx(
            np.mean(touched), rel=0.04
        )


def test_skew_makes_the_busiest_gpu_busier_the_more_gpus():
    for ep, tokens in itertools.product((2, 4, 8), (64, 4096)):
        uniform = ep_expert_tokens(128, 8, ep, tokens)[1]
        assert ep_skewed_tokens(128, 8, ep, 0.6, tokens)[1] > uniform
    ratio = [np.divide(*ep_skewed_tokens(128, 8, ep, 0.6, 4096)[::-1]) for ep in (2, 4, 8)]
    assert ratio == sorted(ratio)


def test_an_allreduce_ep_step_with_a_skewed_router_is_slower_at_large_batches():
    skewed = load_model({"base": "qwen3-30b-a3b", "routing_skew": 0.6}, "t", "model")
    ep = [RooflineLatencyModel(m, GPUS["h200"], 2, 0.0, expert_parallel="allreduce")
          for m in (MODELS["qwen3-30b-a3b"], skewed)]  # fmt: skip
    big = [m.step_time(4096, 4096 * 4097 / 2, 1, 0, 0) for m in ep]
    assert big[1] > big[0]  # the busiest GPU holds hot experts: more tokens than its share
    small = [m.step_time(0, 0.0, 0, 8, 8 * 1024) for m in ep]
    assert small[1] < small[0]  # 8 tokens touch fewer experts when skewed


def test_all_to_all_with_a_skewed_router_is_refused():
    from tests.policy_kit import config, simulate_config

    model = {"base": "qwen3-30b-a3b", "routing_skew": 0.6}
    hw = {"gpu": "h200", "tp": 2, "expert_parallel": "all_to_all"}
    with pytest.raises(ConfigError, match="dispatch and combine"):
        simulate_config(config(model=model, hardware=hw))
    hw["expert_parallel"] = True
    assert simulate_config(config(model=model, hardware=hw))  # the all-reduce layout runs
