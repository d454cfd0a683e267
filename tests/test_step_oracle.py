"""The neighbour oracle (`simulator.latency.step_oracle`) by hand."""

from __future__ import annotations

import pytest

from simulator.latency.step_oracle import neighbour_oracle, neighbour_predictions


def _dec(t_ms, b=8, ctx=1000, scenario="s", proc=0, prefill=0):
    return {
        "scenario": scenario, "proc": proc, "prefill_tokens": prefill, "decode_seqs": b,
        "decode_ctx": ctx, "target": t_ms / 1e3,
    }  # fmt: skip


def test_each_decode_step_is_predicted_by_the_median_of_its_near_equal_neighbours():
    rows = [_dec(10, ctx=1000), _dec(12, ctx=1010), _dec(20, ctx=1019), _dec(11, ctx=1021)]
    got = {r["target"]: p for r, p in neighbour_predictions(rows)}
    assert got[0.010] == pytest.approx(0.016)  # 12, 20 (1021 is 2.1% away)
    assert got[0.012] == pytest.approx(0.011)  # 10, 20, 11
    assert got[0.020] == pytest.approx(0.011)  # 10, 12, 11
    assert got[0.011] == pytest.approx(0.016)  # 12, 20 (1000 is 2.06% of 1021 away)


def test_only_decode_steps_of_the_same_scenario_process_and_batch_are_neighbours():
    base = [_dec(10), _dec(30, ctx=1001)]
    others = [
        _dec(50, scenario="t"), _dec(50, proc=1), _dec(50, b=9), _dec(50, prefill=64),
    ]  # fmt: skip
    got = neighbour_predictions(base + others)
    assert got == []  # each base step has one neighbour: fewer than two predict nothing
    three = [*base, _dec(20, ctx=999)]
    assert [p for _, p in neighbour_predictions(three + others)] == pytest.approx(
        [0.025, 0.015, 0.020]
    )


def test_the_report_puts_the_model_beside_the_oracle_on_the_same_steps():
    class Flat:  # predicts 20 ms for every step
        def predict_row(self, r):
            return 0.020

    rows = [_dec(10), _dec(20, ctx=1001), _dec(40, ctx=1002)]

    def stats(errs):
        return sorted(round(e, 6) for e in errs)

    out = neighbour_oracle(Flat(), rows, stats)
    # oracle: 10 <- 30, 20 <- 25, 40 <- 15; the model: 20 for each
    assert out["oracle"] == [-0.625, 0.25, 2.0]
    assert out["model"] == [-0.5, 0.0, 1.0]
