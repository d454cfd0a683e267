"""Chunked prefill (Sarathi-Serve; vLLM v1's default scheduler).

One token budget per step, ``max_num_batched_tokens``. Every step:

1. running decodes first: each decode-set member costs one token of the budget (it gets the KV
   block it needs; on shortage the newest running request is preempted);
2. then prompt chunks fill the rest: partially prefilled running requests first (admission
   order), then new waiting requests (FCFS) while ``len(running) < max_num_seqs``. A chunk is
   ``min(num_pending, budget left)``; the request that completes its prompt samples its first
   token and joins the decode set.

Decodes therefore never stall behind a long prompt: a step's time is bounded by the budget, so
TPOT and ITL stay low on long-prompt workloads where continuous batching's whole-prompt steps
pause every decode.

KV: a running request that cannot get blocks for its chunk preempts the newest running request
(itself last); a waiting request that does not fit (keeping ``watermark`` free) waits.

YAML (``scheduler:``): ``policy: chunked_prefill``, ``max_num_batched_tokens`` (2048; must be >=
``max_num_seqs``, else running decodes could exceed the budget), ``max_num_seqs`` (256),
``watermark`` (0.01), ``preemption`` / ``swap_link`` (policies/preemption.py).

Invariants: sum of a step's tokens (chunks + decode-set members) <= ``max_num_batched_tokens``;
a request is chunked only after its KV for the chunk is allocated.
"""

from __future__ import annotations

import math
from typing import ClassVar

from policies.base import Policy
from policies.common import (
    batching_params,
    grow_decodes,
    newest_running,
    prefix_hit,
    read_watermark,
    start_from_cache,
    too_long,
)
from policies.preemption import Preemption
from simulator.cfg import Section
from simulator.plan import IDLE, StepPlan
from simulator.request import RUNNING


class ChunkedPrefill(Policy):
    name = "chunked_prefill"
    #: with nothing waiting and every running request decoding, `schedule` after a finish is
    #: `grow_decodes` and a decode-only plan (no prompt to continue or admit)
    decodes_past_finish = True
    #: parameter defaults (a subclass modelling one engine's defaults overrides them)
    defaults: ClassVar[dict] = {
        "max_num_seqs": 256,
        "max_num_batched_tokens": 2048,
        "watermark": 0.01,
    }

    def __init__(self, sec: Section, engine: dict):
        super().__init__(sec, engine)
        d = self.defaults
        self.max_num_seqs = sec.int("max_num_seqs", d["max_num_seqs"], min=1)
        self.max_num_batched_tokens = sec.int(
            "max_num_batched_tokens", d["max_num_batched_tokens"], min=1
        )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise sec.error(
                "max_num_batched_tokens",
                f"expected >= max_num_seqs {self.max_num_seqs} (every running decode needs a "
                f"token of the budget), got {self.max_num_batched_tokens}",
            )
        self.watermark, self._watermark_blocks = read_watermark(sec, engine, d["watermark"])
        self.preemption = Preemption(sec, engine)
        self.token_budget = self.max_num_batched_tokens

    def params(self) -> dict:
        return batching_params(self)

    def schedule(self, replica, now: float) -> StepPlan:
        pre = self.preemption
        budget = self.max_num_batched_tokens
        if replica.decoding:
            grow_decodes(replica, pre.preempt)
            budget -= len(replica.decoding)
        chunks: list = []
        budget = self._continue_prefills(replica, budget, chunks)
        self._admit_waiting(replica, now, budget, chunks)
        decode = len(replica.decoding) > 0
        extra = pre.take_extra_s()
        if not chunks and not decode and not extra:
            return IDLE
        return StepPlan(chunks=tuple(chunks), decode=decode or bool(extra), extra_s=extra)

    def _continue_prefills(self, replica, budget: int, chunks: list) -> int:
        kv, running = replica.kv, replica.running
        if len(running) == len(replica.decoding.members):
            return budget  # every running request is decoding: no prompt to continue (the
            # usual case; saves a pass over up to max_num_seqs requests every step)
        for req in list(running.values()):
            if budget <= 0:
                break
            if req._dset is not None or req.status != RUNNING:
                continue  # decoding, or preempted by an earlier request in this loop
            n = self._chunk(req.num_pending, budget)
            while not kv.allocate(req, req.num_computed + n):
                victim = newest_running(replica)
                self.preemption.preempt(replica, victim)
                if victim is req:
                    break
            else:
                chunks.append((req, n))
                budget -= n
        return budget

    def _chunk(self, pending: int, budget: int) -> int:
        """Tokens of a prompt with ``pending`` left that one step computes."""
        return min(pending, budget)

    def _fits(self, kv, req, upto: int) -> bool:
        """Whether a waiting request may be admitted to compute up to ``upto`` tokens."""
        return kv.can_allocate(req, upto, self._watermark_blocks)

    def _admit_waiting(
        self, replica, now: float, budget: int, chunks: list, cutoff: float = math.inf,
        held: int = 0,
    ) -> None:  # fmt: skip
        """Admit waiting requests FCFS while budget and sequences last; ``cutoff``: requests
        (never preempted) queued later are not yet visible to the scheduler; ``held``: running
        slots still taken by requests that finished in the step just run (a scheduler that
        plans before it processes outputs: `policies.vllm`, rule 8)."""
        waiting, kv, pre = replica.waiting, replica.kv, self.preemption
        max_running = self.max_num_seqs - held
        while budget > 0 and waiting and len(replica.running) < max_running:
            req = waiting[0]
            if req.queued_s > cutoff and req.num_preemptions == 0:
                break
            if req.num_preemptions == 0 and req.first_scheduled_s is None:
                reason = too_long(replica, req, req.num_prompt_tokens, self._watermark_blocks)
                if reason:
                    waiting.popleft()
                    replica.reject(req, reason, now)
                    continue
            swapped = pre.is_swapped(req)
            hit = prefix_hit(replica, req)
            start = hit or req.num_computed
            n = self._chunk(req.num_tokens - start, budget)
            if not self._fits(kv, req, start + n):
                break
            waiting.popleft()
            kv.allocate(req, start + n)
            start_from_cache(req, hit)
            if swapped:
                pre.swap_in(req)
            replica.admit(req, now)
            chunks.append((req, n))
            budget -= n
