"""`BeyondTable`: a run's record of extrapolated steps does not depend on their order."""

import itertools
import warnings

import pytest

from simulator.latency.beyond import BeyondTable

STEPS = [
    ("decode", "decode batch {:.0f} / total context {:.0f} beyond grid", 600, 9_000),
    ("chunk", "prefill chunk {:.0f} beyond the grid ({:.0f})", 9_000, 8_192),
    ("decode", "decode batch {:.0f} / total context {:.0f} beyond grid", 520, 40_000),
    ("chunk", "prefill chunk {:.0f} beyond the grid ({:.0f})", 8_500, 8_192),
]


def _record(steps) -> list[str]:
    b = BeyondTable("m: ", "; extrapolating linearly")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for kind, template, *values in steps:
            b.note(kind, template, *values)
    return b.texts()


def test_the_record_holds_each_kinds_largest_values_in_every_order():
    want = [  # in kind order: chunk, decode
        "m: prefill chunk 9000 beyond the grid (8192); extrapolating linearly",
        # the largest batch and the largest context, from different steps
        "m: decode batch 600 / total context 40000 beyond grid; extrapolating linearly",
    ]
    for order in itertools.permutations(STEPS):
        assert _record(order) == want


def test_the_first_step_of_a_kind_is_warned_about_once_with_its_own_values():
    b = BeyondTable("m: ")
    with pytest.warns(RuntimeWarning) as said:
        for kind, template, *values in STEPS:
            b.note(kind, template, *values)
    assert [str(w.message) for w in said] == [
        "m: decode batch 600 / total context 9000 beyond grid",
        "m: prefill chunk 9000 beyond the grid (8192)",
    ]
    assert "decode" in b and "tokens" not in b
