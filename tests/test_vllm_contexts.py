"""Decode contexts rebuilt from a profiling run's requests, and the keys-read features a table of
a sliding-window model gets from them (no vLLM, no GPU needed)."""

from __future__ import annotations

from profiles.vllm_contexts import decode_contexts
from profiles.vllm_table import step_rows
from simulator.served import WindowedReads


def _step(t: float, pf: list, ctxs: list[int]) -> dict:
    return {
        "t_sched": t, "t_done": t + 0.5, "pf": pf, "nd": len(ctxs), "dctx": sum(ctxs),
        "dmax": max(ctxs, default=0),
    }  # fmt: skip


# A: prompt 4, 3 output tokens (its prefill samples the first, then 2 decodes at 5 and 6 keys);
# B: prompt 2, 2 output tokens (one decode at 3 keys); C: prompt 3, aborted with its scenario
# ("bg", ends at t=3.2) before its 50 tokens: decodes at 4 and 5 keys, then none.
REQUESTS = {
    "s/0": {"prompt": 4, "out": 3, "t_end": 9.0},
    "s/1": {"prompt": 2, "out": 2, "t_end": 9.0},
    "bg/0": {"prompt": 3, "out": 50},
}
SCENARIOS = [{"id": "s", "t1": 9.0}, {"id": "bg", "t1": 3.2}]


def _run() -> list[dict]:
    return [
        _step(0, [["s/0-ab12", 4, 0], ["bg/0-cd34", 3, 0]], []),
        _step(1, [["s/1-ef56", 2, 0]], [4, 5]),
        _step(2, [], [3, 5, 6]),
        _step(3, [], [6]),  # C is still decoding (ctx 6) in the engine: the log says so
        _step(4, [], []),
    ]


def test_contexts_are_rebuilt_step_by_step_and_checked_against_the_log():
    steps = _run()
    got = decode_contexts(steps, REQUESTS, SCENARIOS)
    assert got[:3] == [[], [4, 5], [3, 5, 6]]
    # step 3: the rebuild has C decoding at 6 keys -> matches; step 4: C ended with its scenario
    assert got[3] == [6] and got[4] == []
    # a step whose log disagrees with the rebuild gets no contexts (nothing guessed)
    steps[2]["dctx"] += 1
    assert decode_contexts(steps, REQUESTS, SCENARIOS)[2] is None
    # order of the input does not matter: the result follows it
    rev = list(reversed(_run()))
    assert decode_contexts(rev, REQUESTS, SCENARIOS) == list(reversed(got))


def test_an_unknown_request_leaves_the_steps_it_decodes_in_unresolved():
    steps = [_step(0, [["warmup/0-aa", 3, 0]], []), _step(1, [], [4]), _step(2, [], [])]
    assert decode_contexts(steps, {}, []) == [[], None, []]


def test_sliding_features_count_the_keys_read_by_hand():
    """Window 4, half the layers full: contexts 3, 6 and 10 read 19 keys on full layers and
    3 + 4 + 4 = 11 on sliding ones, 15 per layer on average; a 6-token chunk after 2 computed
    tokens: full 6 x (2 + 3.5) = 33 pairs, sliding 3 + 4 x 5 = 23 (queries at 3..8 keys)."""
    reads = WindowedReads(4, 0.5)
    steps = [
        _step(0, [["s/0-a", 6, 2]], [3, 6, 10]),
        _step(1, [], [3, 4]),  # within the window: the plain sum, no contexts needed
        _step(2, [], [9]),  # past the window, contexts unknown
    ]
    rows = step_rows(steps, reads, [[3, 6, 10], None, None])
    assert rows[0]["decode_ctx"] == 15.0 and rows[0]["prefill_attn"] == 28.0
    assert rows[1]["decode_ctx"] == 7 and rows[2]["decode_ctx"] is None
    # full attention (no reads): the logged sums, as before
    plain = step_rows(steps)
    assert plain[0]["decode_ctx"] == 19 and plain[0]["prefill_attn"] == 33.0
