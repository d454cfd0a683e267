"""The busiest GPU of an expert-parallel group when the router is skewed (``model.routing_skew``).

Why: with expert parallelism every GPU holds ``m = E / ep`` whole experts, and a step waits for
the GPU with the most work, in every MoE layer. Under uniform routing the GPUs differ only by
sampling noise (`simulator.served.ep_expert_tokens`, `ep_experts_touched`, closed forms). Under
a skewed router they differ by *placement*: a GPU that holds two of the hottest experts carries
far more than its share, for every token. Where the hot experts sit is the trained router's
business, not the serving engine's (vLLM places experts by index, contiguously); this module
takes the popularity ranks as a uniformly random permutation of the experts, drawn anew per
layer as hot experts differ between layers, and returns expectations over placements.

Model: expert ``e`` of rank ``r(e)`` is in a token's top-k with probability ``p_r``
(`simulator.served.routing_probabilities`), independently across tokens, so its token count in
a step of ``T`` tokens is exactly Binomial(T, p_r) marginally (the counts of one token's k
distinct experts are weakly dependent; ignored). A GPU's load is the sum of its experts'
counts, its weights read the experts with a count above zero. Both expected maxima over GPUs
are estimated by Monte Carlo over `PLACEMENTS` seeded placements with one binomial draw each, on
a grid of token counts (`GRID`), and interpolated in log2(T) between them: deterministic,
memoized per (E, k, ep, skew), ~0.2 s to build for 128 experts. `tests/test_ep_skew.py` checks
it against uniform routing's closed forms and against token-by-token top-k routing.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from simulator.served import routing_probabilities

#: placements (and binomial draws) the expectations average over
PLACEMENTS = 512
#: token counts of the grid: every count to 16 (where the maxima bend most), then four a
#: doubling to 2^17
GRID = tuple(float(t) for t in range(1, 16)) + tuple(2.0 ** (i / 4) for i in range(16, 69))


@functools.lru_cache(maxsize=32)
def _grid(num_experts: int, top_k: int, ep: int, skew: float) -> tuple[np.ndarray, np.ndarray]:
    """Per grid token count: the expected most tokens any GPU gets over its mean share, and the
    expected most distinct experts any GPU touches (module docstring)."""
    p = np.asarray(routing_probabilities(num_experts, top_k, skew))
    rng = np.random.default_rng(0)
    placed = np.stack([p[rng.permutation(num_experts)] for _ in range(PLACEMENTS)])
    placed = placed.reshape(PLACEMENTS, ep, num_experts // ep)
    load_ratio, touched = [], []
    for t in GRID:
        counts = rng.binomial(int(t), placed)
        load_ratio.append(counts.sum(-1).max(-1).mean() / (t * top_k / ep))
        touched.append((counts > 0).sum(-1).max(-1).mean())
    return np.array(load_ratio), np.array(touched, dtype=float)


_LOG_GRID = np.log2(GRID)


def _at(values: np.ndarray, tokens: float) -> float:
    """``values`` on `GRID`, linear in log2(tokens) between grid points (clamped at the ends)."""
    return float(np.interp(math.log2(max(tokens, 1.0)), _LOG_GRID, values))


def ep_skewed_tokens(num_experts: int, top_k: int, ep: int, skew: float, tokens: float):
    """(mean, expected max over GPUs) of the expert copies of ``tokens`` tokens that land on one
    GPU of ``ep``, routed with ``skew`` and placed at random (module docstring). The skewed
    counterpart of `simulator.served.ep_expert_tokens`."""
    if tokens <= 0:
        return 0.0, 0.0
    mean = tokens * top_k / ep
    ratio, _ = _grid(num_experts, top_k, ep, float(skew))
    return mean, mean * _at(ratio, tokens)


def ep_skewed_touched(num_experts: int, top_k: int, ep: int, skew: float, tokens: float):
    """(mean, expected max over GPUs) of the distinct experts ``tokens`` tokens touch among one
    GPU's ``E / ep``, routed with ``skew`` and placed at random: the weights the busiest GPU
    reads. The skewed counterpart of `simulator.served.ep_experts_touched`."""
    if tokens <= 0:
        return 0.0, 0.0
    p = routing_probabilities(num_experts, top_k, skew)
    mean = sum(1.0 - (1.0 - q) ** tokens for q in p) / ep
    _, touched = _grid(num_experts, top_k, ep, float(skew))
    return mean, max(mean, _at(touched, tokens))


__all__ = ["ep_skewed_tokens", "ep_skewed_touched", "PLACEMENTS"]
