"""What a policy decides for one engine step.

A `StepPlan` is frozen: the policy decides, the replica executes and commits. Policies never
advance progress themselves.

* ``chunks``: ``(request, num_new_tokens)`` pairs computed this step: whole prompts, prompt
  chunks, recomputes after preemption, or single tokens of requests kept out of the decode set.
  A chunk that completes a request's pending tokens samples one new token.
* ``decode``: advance every member of the replica's `DecodeSet` by one token.
* ``wake_at``: for an idle plan (nothing to run), the latest time at which the replica should ask
  again even if nothing arrives (dynamic batching's max wait).
* ``verify``: speculative decoding. A chunk ``(req, n)`` of a decoding request (one pending token)
  is charged as a ``1 + verify``-token chunk over its cache (the target model verifies the
  pending token plus ``verify`` draft tokens) and commits ``n`` tokens: the pending one plus
  ``n - 1`` accepted drafts, so it emits ``n`` tokens (``n - 1 <= verify``).
* ``extra_s``: seconds added to the step's time for work outside the latency model (draft model
  steps, KV swap copies over PCIe). A plan with ``extra_s > 0`` is never coalesced.
* ``next_tokens``: an async-scheduling engine launches the *next* step while this one runs
  (vLLM: ``step_with_batch_queue``), and this step's outputs reach clients only once that launch
  returns. A policy that knows the next step will carry prefill tokens (> 0 here: that step's
  token count) lets the executor end this step no earlier than the next one's launch
  (`SimulatedExecutor`); 0 means nothing is known. Never set on coalescable plans.
* ``after_idle``: the step was planned on an idle engine, whose loop first wakes from a
  blocking wait for input (vLLM: ~2 ms more than a running engine takes to see a request);
  the executor charges that wake (`Frontend.idle_plan_s`). Never set on coalescable plans.
"""

from __future__ import annotations

from typing import NamedTuple

from simulator.request import Request


class StepPlan(NamedTuple):
    """Immutable (a named tuple: a policy builds one per prompt step, ~0.8 a request, and a
    frozen dataclass's field-by-field ``object.__setattr__`` cost 3x the tuple's build)."""

    chunks: tuple[tuple[Request, int], ...] = ()
    decode: bool = False
    wake_at: float | None = None
    verify: int = 0
    extra_s: float = 0.0
    next_tokens: int = 0
    after_idle: bool = False

    @property
    def is_idle(self) -> bool:
        return not self.chunks and not self.decode


IDLE = StepPlan()
DECODE = StepPlan(decode=True)
