"""What every scheduling policy is.

A policy reads its own parameters from its YAML section (``scheduler:``) and, each step, looks at
a replica's queues and KV cache and returns a `StepPlan`. It may admit, preempt and reject
requests through the replica's helpers (``admit``, ``preempt``, ``reject``) and allocate KV for
the step it plans (the allocator says yes/no; the policy picks victims), but it never advances
progress: the replica commits the plan after the step's time has passed.

Class attributes a policy may override:

* ``uses_decode_set``: requests past their prompt join the replica's `DecodeSet` and are advanced
  together by ``StepPlan(decode=True)`` (the fast path). A policy that schedules decodes one by
  one (e.g. speculative decoding) sets this False and lists them in ``chunks``.
* ``coalescable``: a decode-only plan is repeated unchanged until something arrives, finishes or
  the plan's ``wake_at`` passes; true for every policy whose decisions depend only on queue
  state. The replica then precomputes decode runs (identical results, far fewer events).
* ``decodes_past_finish``: when nothing but the decode set is queued or running (no waiting
  request, no prompt in progress), the plan after a member finishes is the decode of the rest,
  as before it (its KV growth done by ``grow_decodes``); the replica's decode runs then go on
  past finishes instead of ending at each (`Replica._plan_decode_run`). Only with
  ``coalescable``.
"""

from __future__ import annotations

from typing import ClassVar

from simulator.cfg import Section
from simulator.plan import StepPlan


class Policy:
    name: ClassVar[str] = "?"
    uses_decode_set: ClassVar[bool] = True
    coalescable: ClassVar[bool] = True
    decodes_past_finish: ClassVar[bool] = False

    def __init__(self, sec: Section, engine: dict):
        """Read parameters from ``sec`` (call ``sec.done()``); ``engine`` holds shared facts:
        ``max_model_len``, ``block_size``, ``num_blocks``."""
        self.engine = engine

    def schedule(self, replica, now: float) -> StepPlan:
        raise NotImplementedError

    def params(self) -> dict:
        """Resolved parameters, written to config.yaml."""
        return {}
