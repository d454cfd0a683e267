"""The clock dip after long prefills (`simulator.latency.clock_dip`): its arithmetic by hand,
its fit on steps it generated, and how the executor charges it."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from simulator.executor import SimulatedExecutor
from simulator.latency.clock_dip import (
    NEGLIGIBLE,
    ClockDip,
    ClockState,
    HeatLayout,
    fit_clock_dip,
    row_factors,
    row_heats,
)
from simulator.plan import StepPlan
from tests.helpers import LinearLatency

DIP = ClockDip(0.12, rise_s=0.02, recover_s=0.03)  # both constants on the fit's grid


def test_heat_and_factor_by_hand():
    h = DIP.heated(0.0, 0.0, 0.02)  # one rise time from cold
    assert h == pytest.approx(1 - math.exp(-1))
    assert DIP.factor(h, 0.03) == pytest.approx(1 + 0.12 * (1 - math.exp(-1)) * math.exp(-1))
    # a second burst 30 ms later starts from the cooled heat
    h2 = DIP.heated(h, 0.03, 0.02)
    assert h2 == pytest.approx(1 - (1 - h * math.exp(-1)) * math.exp(-1))


def test_factor_is_exactly_one_once_negligible_and_never_rises_while_cooling():
    h = DIP.heated(0.0, 0.0, 1.0)
    since = np.linspace(0, 0.5, 501)
    f = [DIP.factor(h, s) for s in since]
    assert f[0] == pytest.approx(1.12, abs=1e-6)
    assert all(a >= b for a, b in zip(f, f[1:], strict=False))
    cut = DIP.recover_s * math.log(DIP.excess * h / NEGLIGIBLE)  # where excess * heat = 1e-3
    assert all(x == 1.0 for x, s in zip(f, since, strict=True) if s > cut + 1e-9)
    assert all(x > 1.0 for x, s in zip(f, since, strict=True) if s < cut - 1e-9)


def _scenarios(dip: ClockDip | None, n: int = 12) -> tuple[list[dict], np.ndarray]:
    """Profiling-table rows: each scenario a prefill of 1-8k tokens (10-160 ms) then 40 decode
    steps of 7 ms steady; their excess over steady is exactly the dip's (0 without one)."""
    rows, excess = [], []
    for k in range(n):
        tokens = 1024 * (1 + k % 8)
        rows.append(_row(f"s{k}", tokens, 10_000 + 20_000 * (k % 8)))
        excess.append(0.0)
        for _ in range(40):
            rows.append(_row(f"s{k}", 0, 7000.0))
            excess.append(0.0)
    if dip is not None:  # as an executor charges them, one step after the other
        for i, r in enumerate(rows):
            if r["prefill_tokens"]:
                clock, now = ClockState(dip), 0.0
                clock.ran(now, r["dur_us"] * 1e-6, r["prefill_tokens"])
            else:
                excess[i] = clock.factor(now) - 1
                r["dur_us"] *= 1 + excess[i]
            now += r["dur_us"] * 1e-6
        assert row_factors(dip, rows) == pytest.approx(1 + np.array(excess), abs=1e-12)
    return rows, np.array(excess)


def _row(scenario: str, prefill_tokens: int, dur_us: float) -> dict:
    return {"scenario": scenario, "prefill_tokens": prefill_tokens, "after_idle": 0,
            "dur_us": dur_us}  # fmt: skip


def test_fit_recovers_the_dip_that_made_the_steps():
    rows, excess = _scenarios(DIP)
    fitted = [r["prefill_tokens"] == 0 for r in rows]
    dip = fit_clock_dip(rows, fitted, excess)
    assert (dip.rise_s, dip.recover_s) == (DIP.rise_s, DIP.recover_s)
    assert dip.excess == pytest.approx(DIP.excess, rel=1e-9)


def test_fit_finds_no_dip_in_steady_steps():
    rows, _ = _scenarios(None)
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.01, len(rows))  # 1% symmetric noise, no history
    assert fit_clock_dip(rows, [r["prefill_tokens"] == 0 for r in rows], noise) is None


def test_heats_use_completion_stamps_when_rows_have_them():
    """A serving replay's rows carry ``t_done``: an idle gap between steps cools the heat."""
    rows = [
        {"prefill_tokens": 2048, "after_idle": 1, "dur_us": 20_000.0, "t_done": 1.020},
        {"prefill_tokens": 0, "after_idle": 0, "dur_us": 7_000.0, "t_done": 1.027},
        {"prefill_tokens": 0, "after_idle": 1, "dur_us": 7_000.0, "t_done": 1.087},
    ]
    h = row_heats(rows, DIP.rise_s, DIP.recover_s, 1024)
    h0 = 1 - math.exp(-1)
    assert h[0] == 0.0
    assert h[1] == pytest.approx(h0)
    assert h[2] == pytest.approx(h0 * math.exp(-0.06 / 0.03))  # started 60 ms after the prefill


def test_executor_charges_decode_after_a_long_prefill_by_hand():
    lat = LinearLatency()
    lat.clock_dip = DIP
    ex = SimulatedExecutor(lat)
    replica = SimpleNamespace(env=SimpleNamespace(now=0.0))
    prefill = (2048, 2048 * 1024.5, 1, 0, 0, 0)
    t = ex.execute(StepPlan(decode=True), replica, prefill)
    assert t == lat.step_time(*prefill)  # a prefill step itself is not stretched
    replica.env.now = t + 0.01
    decode = (0, 0.0, 0, 8, 800, 100)
    h = 1 - math.exp(-t / DIP.rise_s)
    want = lat.step_time(*decode) * (1 + DIP.excess * h * math.exp(-0.01 / DIP.recover_s))
    assert ex.execute(StepPlan(decode=True), replica, decode) == pytest.approx(want, rel=1e-12)
    replica.env.now = t + 1.0  # long after: the steady time exactly
    assert ex.execute(StepPlan(decode=True), replica, decode) == lat.step_time(*decode)


def test_a_decode_run_equals_its_steps_one_by_one():
    """`decode_run_times` with a dip returns the floats `execute` gives step by step."""
    lat = LinearLatency()
    lat.clock_dip = DIP
    one, run = SimulatedExecutor(lat), SimulatedExecutor(lat)
    replica = SimpleNamespace(env=SimpleNamespace(now=0.0))
    prefill = (4096, 4096 * 2048.5, 1, 0, 0, 0)
    for ex in (one, run):
        replica.env.now = 0.0
        end = ex.execute(StepPlan(decode=True), replica, prefill)
    times = run.decode_run_times(8, 800, 100, 300, end, math.inf)
    now, ctx, longest = end, 800, 100
    for dt in times:
        replica.env.now = now
        assert one.execute(StepPlan(decode=True), replica, (0, 0.0, 0, 8, ctx, longest)) == dt
        now, ctx, longest = now + dt, ctx + 8, longest + 1
    assert len(times) == 300 and times[0] > times[-1] == lat.step_time(0, 0.0, 0, 8, ctx - 8, 399)


def test_clock_state_is_per_replica():
    a, b = ClockState(DIP), ClockState(DIP)
    a.ran(0.0, 0.05, 4096)
    assert a.factor(0.05) > 1.0 and b.factor(0.05) == 1.0
    b.ran(0.0, 0.05, 512)  # under min_prefill_tokens: no heat
    assert b.factor(0.05) == 1.0


def test_the_fits_heat_layout_equals_row_heats():
    """The fit's fast heats (`HeatLayout`) are `row_heats`, on profiling rows (resets at each
    scenario and idle start) and on serving rows (``t_done`` stamps)."""
    rows, _ = _scenarios(DIP)
    rows[45]["after_idle"] = 1  # a reset inside a scenario
    layout = HeatLayout(rows, 1024)
    for rise, recover in ((0.005, 0.01), (0.02, 0.03), (0.16, 0.12)):
        want = row_heats(rows, rise, recover, 1024)
        assert np.allclose(layout.heats(rise, recover), want, rtol=1e-12, atol=0)
    t, stamped = 0.0, []
    for r in rows:
        t += r["dur_us"] * 1e-6
        stamped.append({**r, "t_done": t + 0.001 * (r["after_idle"])})
    want = row_heats(stamped, 0.02, 0.03, 1024)
    assert want.any() and np.allclose(HeatLayout(stamped, 1024).heats(0.02, 0.03), want, rtol=1e-12)
