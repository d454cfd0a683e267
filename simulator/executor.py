"""The seam between the policy world and the clock.

A replica hands each step to an executor and advances simulated time by what it returns. The
simulated executor asks a `StepLatencyModel`; a real-GPU executor (profiles/) runs the same plan
on a GPU and returns the measured time, so one policy code path drives both.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Protocol

from simulator.latency.base import (
    StepLatencyModel,
    after_launch_wait,
    decode_run_times,
    run_times,
)
from simulator.latency.clock_dip import ClockState
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


#: the golden ratio's fractional part: ``frac(k * GOLDEN)`` is the most evenly spread sequence
#: in (0, 1) (Weyl / Kronecker), used to draw launch times by quantile
GOLDEN = 0.6180339887498949


class SimulatedExecutor:
    """Charges each step its latency model's time.

    A model with ``launch_s(tokens)`` (the host time to launch a step of that many tokens)
    makes a step whose plan names the next step's tokens (``StepPlan.next_tokens``) last at
    least that long, since its outputs wait for the launch; the wait is taken back from the next
    step that carries prompt tokens, whose modelled time already includes it (the pair's total
    is what the model was fitted on, `engine_steps`), down to a fifth of its time. Launch times
    are drawn from the model's measured ones where it keeps them (`_launch`). One executor per
    replica, so the carried wait and the launch count are the replica's."""

    can_precompute = True

    def __init__(self, latency: StepLatencyModel):
        self.latency = latency
        self.step_time = latency.step_time
        #: the times of a precomputed decode run (`simulator.latency.base.decode_run_times`):
        #: the model's own when it has one, else one ``step_time`` call a step
        self.decode_run_times = getattr(latency, "decode_run_times", None) or partial(
            decode_run_times, latency.step_time
        )
        self.launch_s = getattr(latency, "launch_s", None)
        self._launch_q = getattr(latency, "launch_quantile_s", None)
        self._launches = 0  # launches drawn so far (`_launch`)
        #: an idle engine's wake before its first plan (`StepPlan.after_idle`)
        self.idle_plan_s = idle_wake_s(latency)
        self._waited = 0.0
        #: the model prices the prefill chunks' cached prefix (MLA's up-projection of it)
        self.prefill_ctx = getattr(latency, "uses_prefill_ctx", False)
        #: decode steps slowed after a long prefill (`simulator.latency.clock_dip`): this
        #: replica's heat, or None for a model without a dip
        dip = getattr(latency, "clock_dip", None)
        self.clock = ClockState(dip) if dip is not None else None
        #: `execute` reads the replica's SimPy clock as the step's start (the dip's heat):
        #: such a replica keeps to SimPy's clock (`Replica.take_arrivals`: running ahead)
        self.reads_env_clock = self.clock is not None
        if self.clock is not None:
            self._steady_run_times = self.decode_run_times
            self.decode_run_times = self._dipped_run_times

    def _launch(self, tokens: int) -> float:
        """This launch's time: with a model that keeps its measured launch times
        (``launch_quantile_s``), the k-th launch takes their ``frac(k * golden ratio)``
        quantile, a sequence that covers (0, 1) evenly from its first terms on, so a run's
        launches spread as the measured ones did, deterministically and without a random
        stream; else the model's ``launch_s``."""
        if self._launch_q is None:
            return self.launch_s(tokens)
        self._launches += 1
        return self._launch_q(tokens, (self._launches * GOLDEN) % 1.0)

    def execute(self, plan: StepPlan, replica: Replica, features: tuple) -> float:
        if self.prefill_ctx and plan.chunks:
            t = self.step_time(*features, prefill_ctx=prefill_context(plan))
        else:
            t = self.step_time(*features)
        clock = self.clock
        if clock is not None:  # the clock dip (`ClockState`): one comparison on most steps
            if features[0]:
                if features[0] >= clock.min_tokens:
                    clock.ran(replica.env.now, t, features[0])
            elif replica.env.now < clock.until:
                t *= clock.factor(replica.env.now)
        if self.launch_s is not None:
            if self._waited and plan.chunks:
                t = after_launch_wait(t, self._waited)
            self._waited = 0.0
            if plan.next_tokens:
                self._waited = max(0.0, self._launch(plan.next_tokens) - t)
                t += self._waited
        if plan.after_idle:
            t += self.idle_plan_s
        return t + plan.extra_s

    def decode_factor(self, start: float) -> float:
        """The clock-dip multiplier of a decode-only step starting at ``start`` (1 without a
        dip); a replica's decode runs over sliding-window reads apply it step by step."""
        return 1.0 if self.clock is None else self.clock.factor(start)

    def _dipped_run_times(
        self, n: int, ctx: int, longest: int, k: int, start: float, until: float
    ) -> list[float]:
        """`decode_run_times` with the clock dip: the steady run when the dip is over at its
        start, else one ``step_time`` a step times the factor at that step's start (exactly
        1.0 once the dip is negligible), so the floats equal step-by-step `execute` calls."""
        clock, step_time = self.clock, self.step_time
        if clock.factor(start) == 1.0:
            return self._steady_run_times(n, ctx, longest, k, start, until)
        now = [start]  # the step's start, advanced as `run_times` advances its clock

        def time_of(c: int, m: int) -> float:
            dt = step_time(0, 0.0, 0, n, c, m) * clock.factor(now[0])
            now[0] += dt
            return dt

        return run_times(time_of, n, ctx, longest, k, start, until)


def idle_wake_s(latency) -> float:
    """An idle engine's wake before its first plan, from a model with a measured serving path
    (``frontend``, `engine_steps.Frontend.idle_plan_s`); 0 for any other model."""
    frontend = getattr(latency, "frontend", None)
    return frontend.idle_plan_s if frontend else 0.0


def prefill_context(plan: StepPlan) -> int:
    """Cached tokens the plan's prefill chunks attend to, summed: ``num_computed`` of every
    chunk `Replica._features` counts as prefill (not a single-token decode, not a speculative
    verify). MLA up-projects them again each chunk (`simulator.served.ShardedModel._mla_ops`)."""
    v, total = plan.verify, 0
    for req, n in plan.chunks:
        c = req._num_computed
        if c > 0 and n > 1 and not (v and req.num_tokens - c == 1):
            total += c
    return total
