"""Continuous batching (Orca's iteration-level scheduling, as vLLM v0 runs it).

Every step the scheduler looks again: a request leaves the batch the step it finishes and its
slot and KV blocks go to the next waiting request at once.

Each step is either
* a prefill step: waiting prompts (FCFS, the front first) are admitted whole while
  ``len(running) < max_num_seqs``, their tokens fit in ``max_num_batched_tokens`` and the paged
  KV cache can hold them while keeping ``watermark`` of its blocks free; decodes pause for it
  (the stall that chunked prefill removes); or
* a decode step: every running request emits one token. Before it, each request that crosses a
  block boundary gets a block; when none is left the newest running request is preempted
  (recompute: its KV is dropped and it re-enters ``waiting`` at the front).

A request longer than the engine can ever hold (``max_model_len``, ``max_num_batched_tokens``,
or the whole KV cache) is rejected with its reason, never dropped silently.

YAML (``scheduler:``): ``policy: continuous``, ``max_num_seqs`` (256), ``max_num_batched_tokens``
(max(8192, max_model_len); must be >= max_model_len), ``watermark`` (0.01), ``preemption``
(recompute | swap, see policies/preemption.py), ``swap_link``. With ``kv_cache.prefix_caching``
a new request starts after its cached prefix (policies.common.prefix_hit).
"""

from __future__ import annotations

from policies.base import Policy
from policies.common import admit_whole_prompts, batching_params, grow_decodes, read_watermark
from policies.preemption import Preemption
from simulator.cfg import Section
from simulator.plan import DECODE, IDLE, StepPlan


class ContinuousBatching(Policy):
    name = "continuous"
    #: with nothing waiting, `schedule` after a finish is `grow_decodes` and DECODE
    decodes_past_finish = True

    def __init__(self, sec: Section, engine: dict):
        super().__init__(sec, engine)
        self.max_num_seqs = sec.int("max_num_seqs", 256, min=1)
        max_len = engine["max_model_len"]
        self.max_num_batched_tokens = sec.int("max_num_batched_tokens", max(8192, max_len), min=1)
        if self.max_num_batched_tokens < max_len:
            # without chunking a whole prompt (or a recompute of prompt + output) runs in one
            # step, so a smaller budget could strand a request forever (vLLM refuses it too)
            raise sec.error(
                "max_num_batched_tokens",
                f"expected >= max_model_len {max_len} without chunked prefill, "
                f"got {self.max_num_batched_tokens}",
            )
        self.watermark, self._watermark_blocks = read_watermark(sec, engine, 0.01)
        self.preemption = Preemption(sec, engine)
        self.token_budget = self.max_num_batched_tokens

    def params(self) -> dict:
        return batching_params(self)

    def schedule(self, replica, now: float) -> StepPlan:
        pre = self.preemption
        if replica.waiting:
            chunks = admit_whole_prompts(self, replica, now, pre)
            if chunks:
                return StepPlan(chunks=tuple(chunks), extra_s=pre.take_extra_s())
        if replica.decoding.members and grow_decodes(replica, pre.preempt):
            if not pre.pending_s:  # no swap copies to charge (the usual case)
                return DECODE
            return StepPlan(decode=True, extra_s=pre.take_extra_s())
        extra = pre.take_extra_s()
        if extra:  # everything was preempted: still charge the swap-out copies
            return StepPlan(chunks=(), decode=True, extra_s=extra)
        return IDLE
