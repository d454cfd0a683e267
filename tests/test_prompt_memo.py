"""The memo of prompt-only step times (`ProfileLatencyModel._prompt_step_time`).

Without chunked prefill every prompt step is prompt-only and most repeat a composition, so
`step_time` remembers them; a remembered time must be the computed float (==) and a run's
warnings must not change, on every shipped torch table, for compositions inside and beyond the
grids (extrapolated: warned once per kind either way).
"""

from __future__ import annotations

import random
import warnings
import zlib

import pytest

from simulator.latency import profiled
from simulator.latency.profiled import load_for_report
from tests.test_decode_run_times import TABLES


def _computed(m, tokens: int, attn: float, seqs: int) -> float:
    """`step_time`'s prompt-only float without the memo (its expression, in its order)."""
    out = m.base + m.mixed + m.gamma * m.ops_time(tokens, attn, seqs, 0, 0, True, 0)
    return out if out > m.eager_floor else m.eager_floor


def _steps(seed: int, count: int):
    rng = random.Random(seed)
    for _ in range(count):
        seqs = rng.choice([1, 1, 1, 2, 3, 8, 40])
        tokens = sum(rng.choice([1, 17, 200, 1000, 4000, 9000, 40000]) for _ in range(seqs))
        attn = tokens * (tokens / seqs + 1) / 2 * rng.choice([1.0, 1.0, 1.7])
        yield tokens, attn, seqs


@pytest.mark.parametrize("table", TABLES)
def test_prompt_memo_equals_computed_time_and_warnings(table):
    memo, plain = load_for_report(table), load_for_report(table)
    steps = list(_steps(zlib.crc32(table.encode()), 60))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for tokens, attn, seqs in steps + steps:  # the second pass hits the memo
            assert memo.step_time(tokens, attn, seqs, 0, 0, 0) == _computed(
                plain, tokens, attn, seqs
            )
    assert memo._prompt_steps  # the memo was used
    assert memo.describe()["warnings"] == plain.describe()["warnings"]


def test_prompt_memo_is_bounded_and_cleared_by_fit(monkeypatch):
    monkeypatch.setattr(profiled, "PROMPT_MEMO", 4)
    m = load_for_report(TABLES[0])
    for tokens in range(100, 110):
        m.step_time(tokens, tokens * (tokens + 1) / 2, 1, 0, 0, 0)
        assert 1 <= len(m._prompt_steps) <= 4
    m.fit()
    assert not m._prompt_steps
