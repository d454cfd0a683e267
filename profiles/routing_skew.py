"""Skewed routers for dummy-weight MoE tables: the calibration, in numpy (no torch, no vLLM).

A job's ``"routing_skew": s`` (the simulator's ``model.routing_skew``) records a table whose
routers skew as the simulator assumes. A real router sends more tokens to some experts than to
others (`simulator.served`'s ``ROUTING_SKEW_SOURCE``: DeepSeek-R1's busiest expert 11.95x the
mean, a Zipf exponent of 0.6). A trained router does it through the part of its input every
token shares; so does this one.
Every token embedding gets one constant vector ``c`` (seeded N(0, 1) a channel) added, which
the stream carries through every layer as it carries the embedding, and each router's weight
is changed along the direction ``u`` in which it sees ``c`` (``g * c / rms(x)``, ``g`` its norm's
weight): ``W <- W - (W u) u^T / |u|^2 + b u^T / |u|^2``. Every token then gets the same logit
offset ``b_e`` for expert ``e`` on top of its own N(0, logit_std^2) logits (whose spread the
projection leaves, less one of H dimensions). ``b`` (`skew_offsets`) is calibrated so that an
expert of popularity rank ``i`` is in a token's top-k with the probability the simulator's
`simulator.served.routing_probabilities` gives it: the table is timed with the routing the
simulator assumes. Which expert holds which rank is drawn per layer (seeded), as hot experts
differ between layers. Tokens route independently (no correlation between the tokens of one
sequence): the same assumption as the simulator's `expected_experts_touched`. Only routers that
rank softmax (or raw) logits in one group can be skewed this way (`check_skewable`): DeepSeek-V3's
grouped sigmoid routing is refused.

`profiles.dummy_routing` applies the plan to a loaded model (`SkewPlan`: offsets and constant
vector); this module computes it and summarizes what routers did (`summarize_routing`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: tokens, rounds and step of the Monte-Carlo calibration of the skew offsets (`skew_offsets`):
#: the coldest of 128 experts at skew 0.6 (p ~ 0.03) has ~900 samples a round; a full step
#: (1.0) overshoots for 128 experts, 0.5 settles within 20 rounds (checked on 8-128 experts)
CALIBRATION_TOKENS, CALIBRATION_ROUNDS, CALIBRATION_STEP = 32768, 25, 0.5


@dataclass(frozen=True)
class SkewPlan:
    """What a skewed router needs (module docstring): ``offsets``, the logit offset of each
    popularity rank (hottest first, mean 0), and ``constant``, the vector every token
    embedding gets added (float64, one value a channel). ``input_rms``: the RMS of an
    embedding row with it, which the router's norm divides by."""

    skew: float
    offsets: np.ndarray
    constant: np.ndarray

    @property
    def input_rms(self) -> float:
        return math.sqrt(1.0 + float(np.mean(self.constant**2)))


def skew_plan(hf_cfg: dict, skew: float, seed: int = 0, logit_std: float = 1.0) -> SkewPlan:
    """The `SkewPlan` of a model (its config.json) routed with Zipf exponent ``skew``; the
    router must be one that can be skewed (`check_skewable`)."""
    check_skewable(hf_cfg)
    e, k = num_experts_of(hf_cfg), top_k_of(hf_cfg)
    constant = np.random.default_rng([seed, 1]).standard_normal(hf_cfg["hidden_size"])
    return SkewPlan(skew, skew_offsets(e, k, skew, logit_std, seed), constant)


def skew_offsets(
    num_experts: int, top_k: int, skew: float, logit_std: float = 1.0, seed: int = 0
) -> np.ndarray:
    """Logit offsets, by popularity rank, that put the expert of rank ``i`` into a token's top
    ``top_k`` with the probability `simulator.served.routing_probabilities` gives it, when each
    token's own logits are i.i.d. N(0, ``logit_std``^2): damped fixed-point rounds of ``b +=
    step x log(target / share)`` on one seeded Monte-Carlo sample (`CALIBRATION_TOKENS`).
    Deterministic for the same arguments; mean 0; non-increasing up to sampling noise."""
    from simulator.served import routing_probabilities

    target = np.asarray(routing_probabilities(num_experts, top_k, skew))
    z = np.random.default_rng(seed).standard_normal((CALIBRATION_TOKENS, num_experts))
    z *= logit_std
    b = np.zeros(num_experts)
    floor = 0.5 / CALIBRATION_TOKENS  # an expert no token picked this round
    for _ in range(CALIBRATION_ROUNDS):
        share = topk_shares(z + b, top_k)
        b += CALIBRATION_STEP * logit_std * (np.log(target) - np.log(np.maximum(share, floor)))
    return b - b.mean()


def topk_shares(logits: np.ndarray, top_k: int) -> np.ndarray:
    """Per expert (column), the fraction of tokens (rows of ``logits``) that have it among
    their ``top_k`` largest logits: what a softmax top-k router picks. Sums to ``top_k``."""
    top = np.argpartition(-logits, top_k - 1, axis=1)[:, :top_k]
    return np.bincount(top.ravel(), minlength=logits.shape[1]) / logits.shape[0]


def offset_router(w: np.ndarray, u: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Router weight ``w`` (experts x hidden) changed so that an input with component ``u``
    gets logit ``offsets[e]`` from it for expert ``e``, and ``w``'s own response along ``u`` is
    gone: ``w - (w u) u^T / |u|^2 + offsets u^T / |u|^2``. Inputs orthogonal to ``u`` get
    exactly ``w``'s logits."""
    uu = float(u @ u)
    return w - np.outer(w @ u, u) / uu + np.outer(offsets, u) / uu


def check_skewable(hf_cfg: dict) -> None:
    """Raise ValueError unless the router ranks softmax (or raw) logits over one group of
    experts, which a logit offset can skew as calibrated (`skew_offsets`): DeepSeek-V3's
    grouped sigmoid routing with a correction bias is not such a router."""
    scoring = hf_cfg.get("scoring_func", "softmax")
    groups = hf_cfg.get("n_group") or 1
    if scoring != "softmax" or groups > 1:
        raise ValueError(
            f"routing_skew needs a router that ranks softmax logits in one group; this one "
            f"scores by {scoring} over {groups} groups (config.json scoring_func, n_group)"
        )


def top_k_of(hf_cfg: dict) -> int:
    """Experts each token routes to, from a config.json (``num_experts_per_tok``; gpt-oss:
    ``experts_per_token``)."""
    for key in ("num_experts_per_tok", "experts_per_token"):
        if isinstance(hf_cfg.get(key), int):
            return hf_cfg[key]
    raise ValueError("config.json names no experts per token (num_experts_per_tok, "
                     "experts_per_token)")  # fmt: skip


def num_experts_of(hf_cfg: dict) -> int:
    """Routed experts per MoE layer, from a config.json (the field each family names it by)."""
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if isinstance(hf_cfg.get(key), int):
            return hf_cfg[key]
    raise ValueError("config.json names no expert count (num_experts, num_local_experts, "
                     "n_routed_experts)")  # fmt: skip


def summarize_routing(tops: list[np.ndarray], num_experts: int, top_k: int) -> dict:
    """Medians over routers of what each router's ``top`` (tokens x top_k expert ids) shows:
    the hottest expert's load over the mean (``max_over_mean``), the expert shares by rank
    (``shares_by_rank``, each the fraction of tokens that picked it) and the distinct experts
    touched by groups of 8 and 64 consecutive tokens (``touched``)."""
    by_rank, worst, touched = [], [], {8: [], 64: []}
    for top in tops:
        counts = np.bincount(top.ravel(), minlength=num_experts)
        shares = np.sort(counts)[::-1] / top.shape[0]
        by_rank.append(shares)
        worst.append(shares[0] * num_experts / top_k)
        for t in touched:
            n = top.shape[0] // t * t
            groups = np.sort(top[:n].reshape(-1, t * top_k), axis=1)
            touched[t].append(float(np.mean(1 + np.count_nonzero(np.diff(groups, axis=1), 1))))
    return {
        "routers": len(tops),
        "tokens": int(tops[0].shape[0]) if tops else 0,
        "max_over_mean": round(float(np.median(worst)), 3),
        "touched": {str(t): round(float(np.median(v)), 2) for t, v in touched.items()},
        "shares_by_rank": [round(float(x), 5) for x in np.median(by_rank, axis=0)],
    }


__all__ = [
    "SkewPlan", "skew_plan", "skew_offsets", "topk_shares", "offset_router", "check_skewable",
    "num_experts_of", "top_k_of", "summarize_routing",
]  # fmt: skip
