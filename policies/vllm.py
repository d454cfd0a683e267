"""vLLM v1's scheduler as ``vllm serve`` runs it (vLLM 0.24.0), with async scheduling.

Every rule below is read from vLLM 0.24.0's source, ``vllm/v1/core/sched/scheduler.py``
(``Scheduler.schedule``) unless another file is named:

1. **One token budget** per step, ``max_num_batched_tokens`` (``token_budget =
   self.max_num_scheduled_tokens``), and at most ``max_num_seqs`` running requests
   (``if len(self.running) == self.max_num_running_reqs: break``). ``vllm serve`` on an
   H100/H200 uses 8192 and 1024 (``EngineArgs`` defaults for the ``OPENAI_API_SERVER`` usage
   context; read back from the engine by ``profiles/vllm_run.py``); they are this policy's
   defaults.
2. **Running requests first**, in admission order (``while req_index < len(self.running)``):
   each gets ``num_tokens - num_computed_tokens`` tokens (one for a decode, the rest of its
   prompt for a partial prefill), capped by ``long_prefill_token_threshold`` when > 0 and by the
   budget left. Decodes are the decode set here (one budget token each); partial prefills come
   after them, as in vLLM, where the partially prefilled request is the newest running one.
3. **Recompute preemption of the last-admitted running request** when KV blocks run out
   (``preempted_req = self.running.pop()``; ``_preempt_request`` frees its blocks, sets
   ``num_computed_tokens = 0`` and puts it at the *front* of ``waiting``), repeated until the
   allocation succeeds or the request itself was preempted.
4. **Waiting requests FCFS**, only in a step without preemptions (``if not preempted_reqs``),
   while budget is left: prefix-cache hits count as computed (``get_computed_blocks``), the
   chunk is ``min(num_tokens - num_computed, threshold, budget)`` (chunked prefill on), and a
   request is admitted only if its *whole* prompt fits in the free blocks
   (``scheduler_reserve_full_isl = True``, ``allocate_slots(..., full_sequence_must_fit)``,
   vllm/config/scheduler.py and vllm/v1/core/kv_cache_manager.py; ``watermark`` 0.0). The first
   one that does not fit stops admission (``break``).
5. **max_num_partial_prefills**: vLLM 0.24's v1 scheduler does not read it (only
   ``SchedulerConfig`` does, to derive ``long_prefill_token_threshold = 4% of max_model_len``
   when it is > 1); with the default 1 the threshold stays 0 (off). This policy does the same.
6. **Async scheduling** (``--async-scheduling``, on by default; ``EngineCore.
   step_with_batch_queue`` in vllm/v1/engine/core.py): step k+1 is planned while step k runs,
   before k's outputs are processed. A request that reaches the engine while step k runs
   (``Request.queued_s``: after the frontend's input path) is taken from the input queue only
   after step k's outputs (``run_busy_loop`` processes the input queue between loop
   iterations), when k+1 is already planned: it can first run in step k+2. Only when the engine
   has nothing else to run is it planned at once (that plan is ``after_idle``: the loop first
   wakes from its blocking wait for input). Decodes never stall: a
   request whose prompt completes in step k is planned in k+1 with an output placeholder
   (``AsyncScheduler._update_after_schedule``), and no step is planned past ``max_tokens``.

7. **The next step's launch delays this step's outputs** (``step_with_batch_queue``: schedule
   and launch step k+1, *then* wait for step k's output). Launching a step that carries prompt
   tokens takes the engine loop milliseconds of host work (a graph replay) to tens of
   milliseconds (eager inductor code above the largest CUDA-graph size), measured by the
   profiler as ``launch_s``; a step shorter than that launch (a decode step, or a short prefill
   step with the next arrival's prompt behind it) reaches clients only then. Every plan names
   the next step's tokens (``StepPlan.next_tokens``) when that step will carry prompt tokens: a
   prompt this step leaves unfinished, or the head of ``waiting`` admitted next.

8. **A finished request holds its running slot one step longer** under async scheduling: step
   k+1 is planned before step k's outputs are processed, and a request leaves ``self.running``
   only when they are (``Scheduler.update_from_output``: finished requests are freed and
   filtered out of ``running``), so requests that finished in step k still count against
   ``max_num_seqs`` when k+1 is planned. It shows at the cap: DeepSeek-V2-Lite's heavy
   conversation replay runs 1,024 sequences, where planning with their slots free admitted one
   step early and the replayed plan stayed a step ahead (62.6% identical steps before).
   When nothing else would run, vLLM processes the outputs and plans again (as for arrivals,
   rule 6), so an engine with only finished requests frees their slots at once.

Left out, and why: KV blocks freed by requests finishing in step k become usable one step later
under async scheduling (here: at once); priorities (FCFS only); LoRA, structured output,
speculative decoding, encoder inputs and KV connectors. An arrival's own processing in the
engine-core process is not charged: measured on H100 serving, decode steps during which a
request arrived took no longer than the others (median +0.01 ms); what arrivals cost is the
launch of their prefill (rule 7).

Because rule 6 makes a plan depend on when the previous step started, decode runs are not
coalesced (``coalescable = False``): results are exact, at some cost in simulation speed.
"""

from __future__ import annotations

from typing import ClassVar

from policies.chunked_prefill import ChunkedPrefill
from policies.common import grow_decodes
from simulator.cfg import Section
from simulator.plan import IDLE, StepPlan


class Vllm(ChunkedPrefill):
    name = "vllm"
    coalescable = False

    defaults: ClassVar[dict] = {
        "max_num_seqs": 1024,
        "max_num_batched_tokens": 8192,
        "watermark": 0.0,
    }

    def __init__(self, sec: Section, engine: dict):
        super().__init__(sec, engine)
        self.long_prefill_token_threshold = sec.int("long_prefill_token_threshold", 0, min=0)
        self.async_scheduling = sec.bool("async_scheduling", True)
        #: plan time of the step running now (None: the engine is idle)
        self._running_since: float | None = None
        #: the replica's finished requests counted at the last plan (rule 8)
        self._finished_seen = 0

    def params(self) -> dict:
        return {
            **super().params(),
            "long_prefill_token_threshold": self.long_prefill_token_threshold,
            "async_scheduling": self.async_scheduling,
        }

    def schedule(self, replica, now: float) -> StepPlan:
        cutoff, held = now, 0
        finished = replica.num_finished - self._finished_seen  # in the step just run
        self._finished_seen = replica.num_finished
        if self.async_scheduling and self._running_since is not None:
            cutoff = self._running_since  # arrivals during the running step wait one more
            held = finished  # rule 8: they leave `running` after this plan
        idle = self._running_since is None
        plan = self._plan(replica, now, cutoff, idle, held)
        if plan is IDLE and (cutoff < now or held):
            # nothing else to run: vLLM processes the running step's outputs and plans again,
            # so the arrival is planned at once (it is already in the input queue: the loop
            # does not block and wake, not an idle plan) and finished requests have left
            plan = self._plan(replica, now, now, False, 0)
        self._running_since = None if plan is IDLE else now
        return plan

    def _plan(self, replica, now: float, cutoff: float, idle: bool, held: int) -> StepPlan:
        pre = self.preemption
        budget = self.max_num_batched_tokens
        before = pre.stats["recompute"] + pre.stats["swap"]
        if replica.decoding:
            grow_decodes(replica, pre.preempt)
            budget -= len(replica.decoding)
        chunks: list = []
        budget = self._continue_prefills(replica, budget, chunks)
        if pre.stats["recompute"] + pre.stats["swap"] == before:
            self._admit_waiting(replica, now, budget, chunks, cutoff, held)
        decode = len(replica.decoding) > 0
        extra = pre.take_extra_s()
        if not chunks and not decode and not extra:
            return IDLE
        nxt = self._next_prefill(replica, now, chunks) if self.async_scheduling else 0
        return StepPlan(
            chunks=tuple(chunks),
            decode=decode or bool(extra),
            extra_s=extra,
            next_tokens=nxt,
            after_idle=idle,
        )

    def _next_prefill(self, replica, now: float, chunks: list) -> int:
        """Tokens of the step after this one, if it will carry prompt tokens: a prompt this
        step leaves unfinished (running requests first, rule 1), else the head of ``waiting``
        if it fits (rule 4): it is queued by now, so the next plan sees it (rule 6). Its launch
        runs while this step runs and delays this step's outputs (rule 7). The next step's
        decodes: today's, plus the prompts this step completes."""
        budget = self.max_num_batched_tokens - len(replica.decoding)
        done = 0
        for req, n in chunks:
            left = req.num_tokens - req.num_computed - n
            if left > 0:
                return self._chunk(left, budget) + len(replica.decoding) + done
            done += 1
        if not replica.waiting or len(replica.running) >= self.max_num_seqs:
            return 0
        req = replica.waiting[0]  # queued by now: the next plan sees it (rule 6)
        if not self._fits(replica.kv, req, req.num_tokens):
            return 0
        nxt = self._chunk(req.num_tokens - req.num_computed, budget - done)
        return nxt + len(replica.decoding) + done if nxt > 0 else 0

    def _chunk(self, pending: int, budget: int) -> int:
        t = self.long_prefill_token_threshold  # rule 2 / 4: 0 is off
        return min(pending, t if 0 < t < pending else pending, budget)

    def _fits(self, kv, req, upto: int) -> bool:
        return kv.can_allocate(req, req.num_tokens, 0)  # rule 4: the whole sequence must fit
