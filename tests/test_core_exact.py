"""Runs small enough to compute by hand, with a constant step time D."""

import math

import pytest

from tests.helpers import LinearLatency, run_engine, spec

D = 0.01


def test_single_request_ttft_tpot_e2e_exact():
    cols, _ = run_engine([spec(0.0, 100, 5)])
    # one prefill step emits the first token, four decode steps emit the rest
    assert cols["ttft_s"][0] == pytest.approx(D)
    assert cols["e2e_s"][0] == pytest.approx(5 * D)
    assert cols["tpot_s"][0] == pytest.approx(D)
    assert cols["queue_s"][0] == 0.0


def test_single_token_output_has_no_tpot():
    cols, _ = run_engine([spec(0.0, 10, 1)])
    assert cols["e2e_s"][0] == pytest.approx(D)
    assert math.isnan(cols["tpot_s"][0])


def test_two_simultaneous_prompts_share_one_prefill_step():
    cols, reps = run_engine([spec(0.0, 100, 3), spec(0.0, 200, 3)])
    assert list(cols["ttft_s"]) == pytest.approx([D, D])
    assert list(cols["e2e_s"]) == pytest.approx([3 * D, 3 * D])
    assert reps[0].steps[0][2] == 300  # prefill tokens of the first step


def test_arrival_mid_decode_pauses_decodes_for_its_prefill():
    # A: prefill [0, D); decode [D, 2D). B arrives at 1.5 D: its prefill runs [2D, 3D) and A
    # stalls; then both decode together.
    cols, _ = run_engine([spec(0.0, 50, 4), spec(1.5 * D, 50, 2)])
    assert cols["ttft_s"][0] == pytest.approx(D)
    assert cols["ttft_s"][1] == pytest.approx(3 * D - 1.5 * D)
    # A's tokens at D, 2D, 4D, 5D -> finish 5D; B's at 3D, 4D -> finish 4D
    assert cols["finish_s"][0] == pytest.approx(5 * D)
    assert cols["finish_s"][1] == pytest.approx(4 * D)


def test_max_num_seqs_queues_the_rest():
    specs = [spec(0.0, 10, 2) for _ in range(3)]
    cols, _ = run_engine(specs, params={"max_num_seqs": 2})
    # two run [0, 2D); the third is admitted at 2D, first token at 3D, done at 4D
    assert sorted(cols["finish_s"]) == pytest.approx([2 * D, 2 * D, 4 * D])
    assert cols["queue_s"][2] == pytest.approx(2 * D)


def test_preemption_by_recompute_exact():
    # 2 blocks of 4 tokens. A (prompt 4) and B (prompt 3) admitted together; watermark 0.
    # A's first decode step needs a second block (position 4); B fits in its block until
    # position 4. Blocks: A=1, B=1 after prefill; A needs 1 more at its first decode -> none
    # free -> newest (B) is preempted and recomputed later.
    cols, reps = run_engine(
        [spec(0.0, 4, 3), spec(0.0, 3, 2)],
        num_blocks=2,
        block_size=4,
        params={"watermark": 0.0, "max_num_batched_tokens": 8192},
        max_model_len=8,
    )
    assert reps[0].num_preemptions == 1
    assert list(cols["preemptions"]) == [0, 1]
    # A: prefill [0,D) tok1; decodes alone [D,2D) tok2, [2D,3D) tok3 -> done at 3D.
    assert cols["finish_s"][0] == pytest.approx(3 * D)
    # B: tok1 at D (prefill together with A), preempted at D, recomputes 3+1 tokens at
    # [3D,4D) -> tok2 at 4D, done.
    assert cols["finish_s"][1] == pytest.approx(4 * D)
    assert reps[0].kv.num_used_blocks == 0


def test_linear_latency_charges_batch_composition():
    lat = LinearLatency(a=1e-3, b=1e-5, c=2e-5, d=1e-8)
    cols, reps = run_engine([spec(0.0, 1000, 2)], latency=lat)
    prefill = 1e-3 + 1e-5 * 1000
    decode = 1e-3 + 2e-5 * 1 + 1e-8 * 1001  # one sequence reading 1001 keys
    assert cols["ttft_s"][0] == pytest.approx(prefill)
    assert cols["e2e_s"][0] == pytest.approx(prefill + decode)
    assert reps[0].steps[1][6] == 1001  # decode_ctx column


def test_horizon_leaves_requests_in_flight_and_accounted():
    specs = [spec(0.0, 10, 100), spec(0.5, 10, 5)]
    cols, _ = run_engine(specs, until=0.255)
    assert list(cols["status"]) == ["running"]  # the second has not arrived yet
    assert cols["generated_tokens"][0] == 25  # steps end at 0.01, 0.02, ..., 0.25
