"""Dynamic batching (Triton / TorchServe style): a batch starts when ``batch_size`` requests wait
or the oldest waiting one has waited ``max_wait_s``; the batch then runs to completion like a
static batch (policies.static).

At low load it does not wait for a full batch (bounded extra TTFT of ``max_wait_s``), so it beats
static batching on TTFT; at high load batches still cannot be refilled as members finish, so it
trails continuous batching on throughput.

The timer is expressed as ``StepPlan.wake_at`` (oldest arrival + ``max_wait_s``), so the decision
is a function of queue state and time, and decode runs stay coalescable. "Oldest" is the front of
``waiting`` by arrival time (preempted requests return to the front and are older).

YAML (``scheduler:``): ``policy: dynamic``, ``batch_size`` (8), ``max_wait_s`` (0.05; 0: never
wait).
"""

from __future__ import annotations

from policies.static import StaticBatching
from simulator.cfg import Section


class DynamicBatching(StaticBatching):
    name = "dynamic"

    def __init__(self, sec: Section, engine: dict):
        super().__init__(sec, engine)
        self.max_wait_s = sec.num("max_wait_s", 0.05, min=0)

    def params(self) -> dict:
        return {"batch_size": self.batch_size, "max_wait_s": self.max_wait_s}

    def ready(self, replica, now: float) -> tuple[bool, float | None]:
        waiting = replica.waiting
        if len(waiting) >= self.batch_size:
            return True, None
        deadline = waiting[0].arrival_s + self.max_wait_s
        if now >= deadline:
            return True, None
        return False, deadline
