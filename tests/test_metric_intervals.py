"""The bootstrap intervals of a replay's percentiles, and where token gaps widen."""

from __future__ import annotations

import numpy as np
import pytest

from profiles import vllm_validate
from profiles.metric_intervals import percentile_intervals


def _one_per_request(values):
    v = np.asarray(values, dtype=float)
    return {"x": (v, np.arange(len(v)))}


def test_identical_requests_give_a_point_interval():
    ci = percentile_intervals(_one_per_request([0.25] * 50), 50)
    assert ci["x.p50"] == [0.25, 0.25] and ci["x.p99"] == [0.25, 0.25]


def test_interval_holds_the_percentile_and_narrows_with_more_requests():
    small = percentile_intervals(_one_per_request(np.arange(100)), 100)
    large = percentile_intervals(_one_per_request(np.arange(0, 100, 0.1)), 1000)
    lo, hi = small["x.p50"]
    assert lo <= 49.5 <= hi
    assert large["x.p50"][1] - large["x.p50"][0] < (hi - lo) / 2  # ~1/sqrt(10) as wide
    # the p99 of 100 requests is about the largest: its interval reaches the top value
    assert small["x.p99"][1] == 99.0


def test_a_request_keeps_all_its_gaps_when_resampled():
    # one request with gaps 1..100: every resample is that request, so the interval is a point
    gaps = np.arange(1.0, 101.0)
    ci = percentile_intervals({"itl": (gaps, np.zeros(100, dtype=np.int64))}, 1)
    assert ci["itl.p95"][0] == ci["itl.p95"][1] == 95.0  # inverted CDF: the 95th of 100


def test_same_seed_same_interval_and_bad_input_is_refused():
    s = _one_per_request(np.random.default_rng(3).exponential(size=200))
    assert percentile_intervals(s, 200) == percentile_intervals(s, 200)
    with pytest.raises(ValueError, match="at least one request"):
        percentile_intervals(s, 0)


def test_request_samples_name_each_values_request():
    phase = {
        "requests": {
            "a": {"t_submit": 0.0, "times": [[0.1, 1], [0.2, 1], [0.4, 2]]},
            "b": {"t_submit": 1.0, "times": [[1.3, 1]]},  # one token: no TPOT, no gap
        }
    }
    samples, window = vllm_validate.request_samples(phase)
    v, owner = samples["itl_s"]
    assert v.tolist() == pytest.approx([0.1, 0.2, 0.0]) and owner.tolist() == [0, 0, 0]
    assert samples["tpot_s"][1].tolist() == [0]
    assert samples["ttft_s"][1].tolist() == [0, 1]
    assert window == {"t0": 0.0, "t1": 1.3, "output_tokens": 5}


def test_engine_vs_client_gaps_by_hand():
    # 20 busy steps: 19 of 10 ms emitting 4 tokens, one of 30 ms emitting 4 (5% of tokens)
    real = [{"dur_us": 10_000.0, "decode_seqs": 4, "after_idle": 0}] * 19
    real += [{"dur_us": 30_000.0, "decode_seqs": 4, "after_idle": 0}]
    real += [{"dur_us": 99_000.0, "decode_seqs": 4, "after_idle": 1}]  # planned idle: left out
    # the client saw gaps of 10 ms but every tenth at 14 ms (delivery jitter)
    times = [[0.0, 1]]
    for k in range(1, 101):
        times.append([times[-1][0] + (0.014 if k % 10 == 0 else 0.010), 1])
    phase = {"requests": {"a": {"t_submit": 0.0, "times": times}}}
    gaps = vllm_validate.request_samples(phase)[0]["itl_s"][0]
    got = vllm_validate.engine_vs_client_gaps(real, gaps)
    assert got["engine_steps_token_weighted"] == [10.0, 10.0, 30.0]
    assert got["client_gaps"][0] == pytest.approx(10.0)
    assert got["client_gaps"][1] == pytest.approx(14.0)


class _Table:
    """A table whose every step takes 10 ms, with graphs up to 512 tokens."""

    launch_waits = {True: [0.020, 0.021, 0.022], False: [0.040, 0.050, 0.060]}
    max_graph = 512

    def predict_row(self, r):
        return 0.010

    def runs_in_graph(self, tokens):
        return tokens <= self.max_graph


def test_launch_waits_serving_beside_the_table_by_hand():
    def step(dur_ms, prefill=0, behind=0, decodes=4, idle=0):
        return {"dur_us": dur_ms * 1e3, "prefill_tokens": prefill, "prefill_behind": behind,
                "decode_seqs": decodes, "after_idle": idle}  # fmt: skip

    real = [
        step(14.0),
        step(10.0, prefill=100, behind=1),  # a graph launch that showed: 14 ms
        step(10.5),
        step(10.0, prefill=200, behind=1),  # 10.5 <= 1.1 x 10: hidden, not counted
        step(45.0),
        step(30.0, prefill=2000, behind=1),  # an eager launch: 45 ms
        step(30.0, idle=1),
        step(10.0, prefill=64, behind=1),  # planned on an idle engine: out
    ]
    got = vllm_validate.launch_waits_vs_table(_Table(), real)
    assert got["graph"]["serving"] == {"count": 1, "p10_p50_p90": [14.0, 14.0, 14.0]}
    assert got["eager"]["serving"]["count"] == 1
    assert got["graph"]["table"]["p10_p50_p90"][1] == pytest.approx(21.0)
    assert vllm_validate.launch_waits_vs_table(object(), real) is None


class _ThinTable(_Table):
    """Too few graph-sized launches attributed, so that kind holds the 0 s placeholder and is
    charged none (`EngineStepModel._fit_launch`)."""

    launch_waits = {True: [0.0], False: [0.040, 0.050, 0.060]}


def test_a_kind_the_table_charges_no_launch_has_no_table_statistics():
    real = [{"dur_us": 14e3, "prefill_tokens": 0, "prefill_behind": 0, "decode_seqs": 4,
             "after_idle": 0}]  # fmt: skip
    got = vllm_validate.launch_waits_vs_table(_ThinTable(), real)
    assert got["graph"]["table"] == {"count": 0, "p10_p50_p90": []}
    assert got["eager"]["table"]["count"] == 3
