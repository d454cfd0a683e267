"""The neighbour oracle (`simulator.latency.step_oracle`) by hand."""

from __future__ import annotations

import pytest

from simulator.latency.step_oracle import (
    cross_pass_oracle,
    cross_pass_predictions,
    neighbour_oracle,
    neighbour_predictions,
    scenario_pass,
)


def _dec(t_ms, b=8, ctx=1000, scenario="s", proc=0, prefill=0, attn=0.0, seqs=0):
    return {
        "scenario": scenario, "proc": proc, "prefill_tokens": prefill, "decode_seqs": b,
        "decode_ctx": ctx, "target": t_ms / 1e3, "prefill_attn": attn, "prefill_seqs": seqs,
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


def test_a_scenario_id_names_its_base_and_pass():
    assert scenario_pass("dec_b8_c128") == ("dec_b8_c128", 0)
    assert scenario_pass("dec_b8_c128~r1") == ("dec_b8_c128", 1)
    assert scenario_pass("x~r12") == ("x", 12)
    assert scenario_pass("x~rz") == ("x~rz", 0)  # not a pass number: the id as it is


def test_a_step_is_predicted_by_the_median_of_like_steps_of_the_other_passes_only():
    rows = [
        _dec(10, scenario="s"), _dec(99, scenario="s", ctx=1001),  # pass 0: never each other's
        _dec(12, scenario="s~r1", ctx=1010),
        _dec(30, scenario="s~r2", ctx=990), _dec(50, scenario="s~r2", ctx=1030),
    ]  # fmt: skip
    got = [(r["scenario"], r["decode_ctx"], p * 1e3) for r, p in cross_pass_predictions(rows)]
    # like: another pass's step with a context within 2% of the step's own
    assert got == [
        ("s", 1000, pytest.approx(21.0)),  # 12, 30 (1030 is 3% away)
        ("s", 1001, pytest.approx(21.0)),  # 12, 30
        ("s~r1", 1010, pytest.approx(40.0)),  # 10, 99, 30, 50 (990 and 1030 are 20 <= 20.2 away)
        ("s~r2", 990, pytest.approx(54.5)),  # 10, 99 (1010 is 20 > 19.8 away)
        ("s~r2", 1030, pytest.approx(12.0)),  # 12 (1000, 1001 are 30, 29 away)
    ]


def test_cross_pass_like_steps_share_scenario_prompt_and_decode_counts():
    base = _dec(10, prefill=64, attn=4096.0, seqs=1, scenario="s")
    others = [
        _dec(20, prefill=64, attn=4096.0, seqs=1, scenario="t~r1"),  # another scenario
        _dec(20, prefill=64, attn=4096.0, seqs=2, scenario="s~r1"),  # another prompt count
        _dec(20, prefill=32, attn=4096.0, seqs=1, scenario="s~r1"),  # other prompt tokens
        _dec(20, prefill=64, attn=4200.0, seqs=1, scenario="s~r1"),  # attention 2.5% away
        _dec(20, b=9, prefill=64, attn=4096.0, seqs=1, scenario="s~r1"),  # other decodes
    ]
    assert cross_pass_predictions([base, *others]) == []
    like = _dec(14, prefill=64, attn=4100.0, seqs=1, scenario="s~r1")
    got = cross_pass_predictions([base, *others, like])
    assert [(r["target"], p) for r, p in got] == [(0.010, 0.014), (0.014, 0.010)]


def test_the_cross_pass_report_judges_the_model_on_the_oracles_steps():
    class Flat:
        def predict_row(self, r):
            return 0.020

    rows = [_dec(10), _dec(40, scenario="s~r1"), _dec(7, scenario="t")]  # "t": one pass

    def stats(errs):
        return sorted(round(e, 6) for e in errs)

    out = cross_pass_oracle(Flat(), rows, stats)
    assert out["given"] == 3
    assert out["oracle"] == [-0.75, 3.0]  # 40 <- 10, 10 <- 40
    assert out["model"] == [-0.5, 1.0]
