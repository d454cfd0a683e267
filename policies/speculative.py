"""Speculative decoding (draft-then-verify, Leviathan et al. 2023; vLLM's spec decode).

Prefill steps are continuous batching's (whole prompts, decodes paused). Every other step is a
verify step: a draft model proposes ``num_speculative_tokens`` (k) tokens per running request,
the target model checks the pending token plus the k drafts in one forward pass, and each request
keeps the accepted prefix of its drafts plus one token the target samples itself.

Cost. The target's verify step is charged as a (k+1)-token chunk over each request's cache
(``StepPlan.verify = k``: prefill-like tokens, so it is memory-bound at small batch and turns
compute-bound as the batch grows: the gain shrinks at high batch). Drafting is charged as
``StepPlan.extra_s = k * draft_cost * t_decode``, where ``t_decode`` is the target's plain decode
step time for the same batch and ``draft_cost`` is a fraction (``draft_cost: 0.1``) or, for a
catalog model (``draft_model: <name>``), the ratio of the draft's weight bytes to the target's
(`ShardedModel.weight_bytes`, precision included: decode steps are memory-bound, so a step costs
about the bytes it reads). Draft prefill is not charged.

Acceptance. Each draft token is accepted with probability ``acceptance_rate`` (alpha)
independently until the first rejection, so the number of accepted drafts a is a truncated
geometric: P(a = j) = alpha^j (1 - alpha) for j < k, P(a = k) = alpha^k, and tokens emitted per
verify step, a + 1, have mean E = (1 - alpha^(k+1)) / (1 - alpha). ``acceptance: sample``
(default) draws a per request per step from the run's generator (``engine["rng"]``, a child of the
experiment seed); ``acceptance: expected`` uses no randomness: a request accumulates E - 1
expected accepted drafts per step and takes the whole part (same long-run mean, deterministic).
A request never emits past its output length (a is capped).

All accepted tokens of a step carry its end time (their inter-token gaps are 0).

KV: before a verify step each request gets blocks for its pending token plus k drafts (rejected
drafts' slots are reused later); on shortage the newest running request is preempted
(recompute).

Requests are scheduled one by one (``uses_decode_set = False``) and decisions draw random numbers
(``coalescable = False``).

YAML (``scheduler:``): ``policy: speculative``, ``num_speculative_tokens`` (4),
``acceptance_rate`` (0.7, in [0, 1]), ``draft_cost`` (0.1) or ``draft_model``, ``acceptance``
(sample | expected), ``max_num_seqs`` (256), ``max_num_batched_tokens`` (max(8192,
max_model_len); must be >= max_model_len and >= max_num_seqs * (k + 1)).
"""

from __future__ import annotations

import numpy as np

from policies.base import Policy
from policies.common import admit_whole_prompts, newest_running, read_watermark
from simulator.cfg import Section
from simulator.models import load_model
from simulator.plan import IDLE, StepPlan
from simulator.request import RUNNING
from simulator.served import ShardedModel


def expected_tokens(alpha: float, k: int) -> float:
    """Mean tokens emitted per verify step: (1 - alpha^(k+1)) / (1 - alpha)."""
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class Speculative(Policy):
    name = "speculative"
    uses_decode_set = False
    coalescable = False

    def __init__(self, sec: Section, engine: dict):
        super().__init__(sec, engine)
        self.k = sec.int("num_speculative_tokens", 4, min=1)
        self.alpha = sec.num("acceptance_rate", 0.7, min=0, max=1)
        self.acceptance = sec.str("acceptance", "sample", choices=["sample", "expected"])
        self.draft_model = sec.raw("draft_model", None)
        if self.draft_model is not None:
            if sec.has("draft_cost"):
                raise sec.error("draft_cost", "give draft_cost or draft_model, not both")
            target = engine.get("model")
            if target is None:
                raise sec.error("draft_model", "needs the target model (run through the runner)")
            draft = load_model(self.draft_model, sec.where, sec.key("draft_model"))
            # a draft step is memory-bound: it costs the target's step by the bytes each reads
            self.draft_cost = ShardedModel(draft).weight_bytes / ShardedModel(target).weight_bytes
            self.draft_model = draft.name
        else:
            self.draft_cost = sec.num("draft_cost", 0.1, min=0)
        self.max_num_seqs = sec.int("max_num_seqs", 256, min=1)
        max_len = engine["max_model_len"]
        self.max_num_batched_tokens = sec.int("max_num_batched_tokens", max(8192, max_len), min=1)
        need = max(max_len, self.max_num_seqs * (self.k + 1))
        if self.max_num_batched_tokens < need:
            raise sec.error(
                "max_num_batched_tokens",
                f"expected >= {need} (max_model_len and max_num_seqs * (k + 1)), "
                f"got {self.max_num_batched_tokens}",
            )
        self.token_budget = self.max_num_batched_tokens
        self.watermark, self._watermark_blocks = read_watermark(sec, engine, 0.01)
        self.rng = engine.get("rng") or np.random.default_rng(0)
        self._credit: dict[int, float] = {}  # acceptance: expected — fractional accepted drafts
        self.stats = {"verify_steps": 0, "verified_seqs": 0, "emitted_tokens": 0}

    def params(self) -> dict:
        return {
            "num_speculative_tokens": self.k,
            "acceptance_rate": self.alpha,
            "acceptance": self.acceptance,
            "draft_cost": self.draft_cost,
            "draft_model": self.draft_model,
            "expected_tokens_per_step": expected_tokens(self.alpha, self.k),
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "watermark": self.watermark,
        }

    def schedule(self, replica, now: float) -> StepPlan:
        chunks = admit_whole_prompts(self, replica, now)
        if chunks:
            return StepPlan(chunks=tuple(chunks))
        decodes = self._grow(replica)
        if not decodes:
            return IDLE
        accepted = self._accepted(decodes)
        chunks = tuple((req, 1 + a) for req, a in zip(decodes, accepted, strict=True))
        n = len(decodes)
        ctx = sum(req.num_computed + 1 for req in decodes)
        longest = max(req.num_computed + 1 for req in decodes)
        t_decode = replica.executor.step_time(0, 0.0, 0, n, ctx, longest)
        self.stats["verify_steps"] += 1
        self.stats["verified_seqs"] += n
        self.stats["emitted_tokens"] += n + int(sum(accepted))
        return StepPlan(chunks=chunks, verify=self.k, extra_s=self.k * self.draft_cost * t_decode)

    def _grow(self, replica) -> list:
        """KV for pending + k drafts of every decoding request; preempt newest on shortage."""
        kv = replica.kv
        for req in list(replica.running.values()):
            if req.status != RUNNING or req.num_pending != 1:
                continue
            need = min(req.num_tokens + self.k, req.num_prompt_tokens + req.max_output_tokens)
            while not kv.allocate(req, need):
                victim = newest_running(replica)
                replica.preempt(victim)
                if victim is req:
                    break
        return [r for r in replica.running.values() if r.num_pending == 1]

    def _accepted(self, decodes: list) -> list[int]:
        k, alpha = self.k, self.alpha
        caps = [req.max_output_tokens - req.num_output - 1 for req in decodes]
        if self.acceptance == "sample":
            if alpha >= 1.0:
                raw = [k] * len(decodes)
            else:
                raw = np.minimum(self.rng.geometric(1.0 - alpha, size=len(decodes)) - 1, k)
        else:
            mean = expected_tokens(alpha, k) - 1.0
            raw = []
            for req in decodes:
                c = self._credit.get(req.id, 0.0) + mean
                a = int(c + 1e-9)
                self._credit[req.id] = c - a
                raw.append(a)
        return [int(min(a, cap)) for a, cap in zip(raw, caps, strict=True)]
