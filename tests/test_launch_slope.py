"""The held-out check of a launch slope in the running decodes (`profiles.launch_slope`)."""

import pytest

from profiles.launch_slope import slope_check


def _rows(level, decodes, split, grow):
    return [
        {"proc": p, "decode_seqs": d, "wait_s": lv * (1 + grow * d), "split": split}
        for p, lv in enumerate(level)
        for d in decodes
    ]


def test_a_launch_that_grows_with_the_decodes_is_found_and_predicts_the_held_out_ones():
    """Two processes at 20 and 40 ms levels, each launch 0.004 of its level longer per decode
    beside it: the relative line is recovered (growth over 256 decodes: 256 * 0.004 over the
    intercept) and the held-out launches are predicted exactly, where the constant (the process
    median) misses them."""
    train = _rows((0.020, 0.040), range(1, 200, 10), "train", 0.004)
    test = _rows((0.020, 0.040), (3, 150, 300), "test", 0.004)
    res = slope_check(train + test)
    assert res["train"] == 40 and res["test"] == 6
    # each process's median sits at 96 decodes: the line is (1 + 0.004 d) / (1 + 0.004 * 96)
    assert res["slope"] == pytest.approx(256 * 0.004, rel=1e-6)
    assert res["median"][1] == pytest.approx(0.0, abs=1e-9)
    # the constant misses the launches at 3, 150 and 300 decodes by 37%, 14% and 37%
    assert res["median"][0] == pytest.approx(0.3676, abs=1e-3)
    assert res["p90"][1] == pytest.approx(0.0, abs=1e-9)


def test_a_flat_launch_gets_no_slope_and_too_few_launches_no_verdict():
    train = _rows((0.020, 0.040), range(1, 200, 10), "train", 0.0)
    test = _rows((0.020,), (3, 150, 300, 400, 500), "test", 0.0)
    res = slope_check(train + test)
    assert res["slope"] == pytest.approx(0.0, abs=1e-9)
    assert res["median"] == pytest.approx((0.0, 0.0), abs=1e-9)
    assert slope_check(train + test[:4]) is None  # 4 held-out launches: fewer than MIN_TEST
    assert slope_check(train[:19] + test) is None
