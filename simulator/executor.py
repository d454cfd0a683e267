"""The seam between the policy world and the clock.

A replica hands each step to an executor and advances simulated time by what it returns. The
simulated executor asks a `StepLatencyModel`; a real-GPU executor (profiles/) runs the same plan
on a GPU and returns the measured time, so one policy code path drives both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from simulator.latency.base import StepLatencyModel
from simulator.plan import StepPlan

if TYPE_CHECKING:
    from simulator.replica import Replica


class StepExecutor(Protocol):
    #: True when step times are a pure function of batch features, so a run of identical
    #: decode steps may be computed ahead of time (see Replica._plan_decode_run).
    can_precompute: bool

    def execute(self, plan: StepPlan, replica: Replica, features: tuple) -> float:
        """Run (or cost) one step; return its duration in seconds."""
        ...


class SimulatedExecutor:
    can_precompute = True

    def __init__(self, latency: StepLatencyModel):
        self.latency = latency
        self.step_time = latency.step_time

    def execute(self, plan: StepPlan, replica: Replica, features: tuple) -> float:
        return self.step_time(*features) + plan.extra_s
