"""The ``vllm`` policy's decisions on hand-built cases, each tied to the vLLM 0.24.0 rule it
follows (policies/vllm.py numbers the rules). Every step takes 1 s (constant latency model), so
times are step counts."""

from __future__ import annotations

import pytest

from policies.vllm import Vllm
from tests.policy_kit import by_id, run, spec


def spy_plans(plans):
    def wrap(rep):
        inner = rep.policy.schedule

        def schedule(replica, now):
            p = inner(replica, now)
            if not p.is_idle:
                plans.append((now, [(q.id, n) for q, n in p.chunks], p.decode))
            return p

        rep.policy.schedule = schedule

    return wrap


def test_defaults_are_vllm_serve_on_hopper():
    # rule 1: 8192 batched tokens, 1024 sequences, no watermark; async scheduling on
    _, reps, _ = run([spec(0, 4, 1)], "vllm")
    assert reps[0].policy.params()["max_num_batched_tokens"] == 8192
    assert reps[0].policy.params()["max_num_seqs"] == 1024
    assert reps[0].policy.params()["watermark"] == 0.0
    assert reps[0].policy.params()["async_scheduling"] is True
    assert Vllm.coalescable is False


def test_running_first_then_waiting_fcfs_in_one_budget():
    # rule 2 + 4: budget 8: step 0->1 r0 chunk 8 of 10; step 1->2 r0's last 2 (running first)
    # and r1's 4-token prompt; step 2->3 both decode.
    plans: list = []
    params = {"max_num_batched_tokens": 8, "max_num_seqs": 4}
    reqs, _, _ = run([spec(0, 10, 3), spec(0, 4, 2)], "vllm", params, wrap=spy_plans(plans))
    assert [p[1:] for p in plans[:3]] == [([(0, 8)], False), ([(0, 2), (1, 4)], False), ([], True)]
    r = by_id(reqs)
    assert (r[0].first_token_s, r[1].first_token_s) == (2.0, 2.0)


def test_long_prefill_token_threshold_caps_each_chunk():
    # rule 2: threshold 3 splits a 7-token prompt into 3 + 3 + 1 even with budget to spare
    plans: list = []
    params = {"max_num_batched_tokens": 64, "max_num_seqs": 4, "long_prefill_token_threshold": 3}
    run([spec(0, 7, 1)], "vllm", params, wrap=spy_plans(plans))
    assert [p[1] for p in plans] == [[(0, 3)], [(0, 3)], [(0, 1)]]


def test_whole_prompt_must_fit_before_admission():
    # rule 4 (scheduler_reserve_full_isl): 4 blocks of 4 tokens; r0 holds 2 blocks (8 tokens,
    # decoding to 9 needs a third), r1's 12-token prompt needs 3 blocks: only 2 are free, so r1
    # waits although its first 4-token chunk would fit; it starts when r0 finishes.
    plans: list = []
    params = {"max_num_batched_tokens": 4, "max_num_seqs": 4}
    reqs, _, _ = run(
        [spec(0, 4, 3), spec(0, 12, 1)], "vllm", params, num_blocks=4, block_size=4,
        max_model_len=16, wrap=spy_plans(plans),
    )  # fmt: skip
    r = by_id(reqs)
    assert r[0].finish_s == 3.0
    assert r[1].first_scheduled_s >= 2.0
    assert all(1 not in [q for q, _ in p[1]] for p in plans if p[0] < 2.0)


def test_async_arrival_during_a_step_waits_one_more_step():
    # rule 6: r0 decodes from t=1 (steps 1->2, 2->3, ...). r1 arrives at 1.5 while step 1->2
    # runs. vLLM plans step 2->3 before step 1->2's outputs are processed, i.e. before it takes
    # r1 from its input queue, so r1 first runs in step 3->4; a synchronous engine runs it in
    # step 2->3.
    reqs, _, _ = run([spec(0, 4, 6), spec(1.5, 4, 1)], "vllm")
    r = by_id(reqs)
    assert r[1].first_scheduled_s == 3.0
    sync, _, _ = run([spec(0, 4, 6), spec(1.5, 4, 1)], "vllm", {"async_scheduling": False})
    assert by_id(sync)[1].first_scheduled_s == 2.0


def test_a_finished_request_holds_its_running_slot_for_one_more_plan():
    # rule 8: max_num_seqs 2. r0 (4 + 2 tokens) and r1 (4 + 8) prefill in step 0->1; r0's last
    # token comes in step 1->2. vLLM plans step 2->3 before it processes step 1->2's outputs,
    # so r0 still holds its slot and r2 (waiting since 0) first runs in step 3->4; planned with
    # r0's slot free (synchronous scheduling), it runs in step 2->3.
    params = {"max_num_seqs": 2}
    reqs, _, _ = run([spec(0, 4, 2), spec(0, 4, 8), spec(0, 4, 1)], "vllm", params)
    r = by_id(reqs)
    assert r[0].finish_s == 2.0 and r[2].first_scheduled_s == 3.0
    sync, _, _ = run(
        [spec(0, 4, 2), spec(0, 4, 8), spec(0, 4, 1)], "vllm", {**params, "async_scheduling": False}
    )
    assert by_id(sync)[2].first_scheduled_s == 2.0


def test_with_nothing_else_to_run_a_finished_requests_slot_frees_at_once():
    # rule 8: max_num_seqs 1; r0 finishes at 2 and nothing else runs, so vLLM processes the
    # outputs and plans again: r1 runs at once
    reqs, _, _ = run([spec(0, 4, 2), spec(0, 4, 1)], "vllm", {"max_num_seqs": 1})
    assert by_id(reqs)[1].first_scheduled_s == 2.0


def test_async_idle_engine_plans_an_arrival_at_once():
    # rule 6: with nothing else to run the arrival is planned immediately
    reqs, _, _ = run([spec(0, 4, 1), spec(5.0, 4, 1)], "vllm")
    assert by_id(reqs)[1].first_scheduled_s == 5.0


def test_preemption_recomputes_the_last_admitted_and_blocks_admission_that_step():
    # rules 3 + 4, synchronous (async off) to isolate them. 3 blocks of 2 tokens. r0 and r1
    # (2-token prompts) prefill at 0 (2 blocks). At 1 both need a second block for their first
    # decode: r0 takes the last one, r1 (last admitted) is preempted (recompute, front of
    # waiting), freeing a block. r2 (arrived 0.5, one block) would fit, but no waiting request
    # is admitted in a step with a preemption. At 2 r1 heads waiting and needs 2 blocks for its
    # 3 tokens: FCFS stops there (vLLM's ``break``), so r2 waits behind it until r0 finishes.
    plans: list = []
    params = {"max_num_batched_tokens": 8, "max_num_seqs": 8, "async_scheduling": False}
    reqs, reps, _ = run(
        [spec(0, 2, 4), spec(0, 2, 4), spec(0.5, 2, 1)], "vllm", params, num_blocks=3,
        block_size=2, max_model_len=8, wrap=spy_plans(plans),
    )  # fmt: skip
    assert reps[0].policy.preemption.stats["recompute"] == 1
    assert plans[:5] == [
        (0, [(0, 2), (1, 2)], False),
        (1.0, [], True),
        (2.0, [], True),
        (3.0, [], True),
        (4.0, [(1, 3), (2, 2)], False),  # r1 recomputes prompt + its 1 output token
    ]
    r = by_id(reqs)
    assert (r[1].num_preemptions, r[2].first_scheduled_s) == (1, 4.0)


@pytest.mark.parametrize(
    "key,value", [("long_prefill_token_threshold", -1), ("async_scheduling", "yes")]
)
def test_bad_parameters_name_the_key(key, value):
    from simulator.errors import ConfigError

    with pytest.raises(ConfigError, match=f"scheduler.{key}"):
        run([spec(0, 4, 1)], "vllm", {key: value})


class _LaunchModel:
    """1 s per step; launching a step of any size takes 3 s of host time."""

    name = "toy-launch"

    def step_time(self, *features):
        return 1.0

    def launch_s(self, tokens):
        return 3.0

    def describe(self):
        return {"name": self.name}


def test_decode_step_waits_for_the_next_prefill_launch_and_the_prefill_gives_it_back():
    # rule 7: r0 decodes from t=1. r1 arrives at 1.5 (async: first runs in step 3->...). The
    # decode step planned at 2 (when r1 is waiting and eligible next) names r1's chunk as its
    # next step: it lasts max(1, 3) = 3 s (2 -> 5); r1's prefill step then takes 1 - 2 s, floored
    # at a fifth: 0.2 s (5 -> 5.2), so the pair costs what the model's pair target says.
    plans: list = []
    reqs, reps, _ = run(
        [spec(0, 4, 8), spec(1.5, 4, 1)], "vllm", latency=_LaunchModel(), wrap=spy_plans(plans)
    )
    r = by_id(reqs)
    assert r[1].first_scheduled_s == 5.0
    assert r[1].first_token_s == pytest.approx(5.2)
    durations = [round(row[1], 6) for row in reps[0].steps]
    assert durations[:4] == [1.0, 1.0, 3.0, 0.2]


def test_synchronous_scheduling_never_waits_for_a_launch():
    from simulator.plan import StepPlan

    assert StepPlan().next_tokens == 0
    # synchronous scheduling launches after outputs: nothing to wait for
    reqs, reps, _ = run(
        [spec(0, 4, 8), spec(1.5, 4, 1)],
        "vllm",
        {"async_scheduling": False},
        latency=_LaunchModel(),
    )
    assert all(row[1] == 1.0 for row in reps[0].steps)


def test_a_short_prefill_step_waits_for_the_next_arrivals_launch_too():
    # rule 7 behind a prefill step: as above, the decode step planned at 2 waits for r1's
    # launch (2 -> 5). r2 arrives at 4, after the plan at 2 that the plan at 5 is cut off by
    # (rule 6): the plan at 5 runs r1's prefill only, but r2 heads waiting, so that step names
    # r2's chunk next and lasts the launch: 0.2 s of its own time (1 s less the 2 s given back,
    # floored at a fifth) + 2.8 s waited (5 -> 8); r2's prefill then takes 0.2 s (8 -> 8.2).
    reqs, reps, _ = run(
        [spec(0, 4, 8), spec(1.5, 4, 1), spec(4.0, 4, 1)], "vllm", latency=_LaunchModel()
    )
    durations = [round(row[1], 6) for row in reps[0].steps]
    assert durations[:5] == [1.0, 1.0, 3.0, 3.0, 0.2]
    assert by_id(reqs)[2].first_token_s == pytest.approx(8.2)


class _FrontendModel:
    """1 s per step; a request reaches the engine 0.6 s after it arrives, and an idle engine's
    loop takes 0.25 s to wake before its first plan (`simulator.latency.engine_steps.Frontend`)."""

    name = "toy-frontend"

    def __init__(self):
        from simulator.latency.engine_steps import Frontend

        self.frontend = Frontend(0.6, 0.0, 0.0, 0.25)

    def step_time(self, *features):
        return 1.0

    def describe(self):
        return {"name": self.name}


def test_the_async_cutoff_counts_from_when_the_engine_saw_a_request():
    # r0 reaches the idle engine at 0.6: its step costs 1 s + the 0.25 s wake (0.6 -> 1.85),
    # then decodes 1.85 -> 2.85 -> 3.85. r1 arrives at 1.5 but reaches the engine at 2.1,
    # after the plan at 1.85 that the plan at 2.85 is cut off by (rule 6): it is first planned
    # at 3.85. Cut off by its arrival instead it would run from 2.85.
    reqs, reps, _ = run([spec(0, 4, 6), spec(1.5, 4, 1)], "vllm", latency=_FrontendModel())
    r = by_id(reqs)
    assert r[0].first_scheduled_s == pytest.approx(0.6)
    assert [round(row[1], 6) for row in reps[0].steps][:2] == [1.25, 1.0]
    assert r[1].first_scheduled_s == pytest.approx(3.85)


class _SpreadLaunchModel(_LaunchModel):
    """As `_LaunchModel`, but it keeps measured launch times: 2 s at quantile 0, 4 s at 1."""

    def launch_quantile_s(self, tokens, u):
        return 2.0 + 2.0 * u


def test_launch_times_are_drawn_by_the_golden_ratio_sequence():
    # the k-th launch takes the frac(k * 0.618...) quantile: 0.618 -> 3.236 s, then 0.236 ->
    # 2.472 s. Same arrivals as the rule-7 case above plus r2 at 6: the decode step planned at
    # 2 waits 3.236 s for r1's launch (2 -> 5.236), r1's prefill keeps a fifth (0.2 s); the
    # decode step planned after r2 arrived waits 2.472 s for r2's.
    from simulator.executor import GOLDEN

    assert GOLDEN == pytest.approx((5**0.5 - 1) / 2)
    reqs, reps, _ = run(
        [spec(0, 4, 12), spec(1.5, 4, 1), spec(6.0, 4, 1)], "vllm", latency=_SpreadLaunchModel()
    )
    durations = [round(row[1], 6) for row in reps[0].steps]
    assert durations[:4] == [1.0, 1.0, pytest.approx(3.236068), 0.2]
    assert pytest.approx(2.472136) in durations[4:]
    again, reps2, _ = run(
        [spec(0, 4, 12), spec(1.5, 4, 1), spec(6.0, 4, 1)], "vllm", latency=_SpreadLaunchModel()
    )
    assert [row[1] for row in reps2[0].steps] == [row[1] for row in reps[0].steps]
