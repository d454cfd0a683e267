"""Tests of the workloads package: arrivals, lengths, trace loaders, limits, config errors.

Fixed seeds make every statistical check deterministic; tolerances are several standard errors
wide so that they would also pass for other seeds.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from simulator.cfg import Section
from simulator.errors import ConfigError
from workloads.arrivals import (
    Constant,
    Gamma,
    Poisson,
    constant_arrivals,
    gamma_arrivals,
    poisson_arrivals,
    repeat_arrivals,
    replay_arrivals,
    spread_quantized,
)
from workloads.build import build_workload, child_streams
from workloads.lengths import Empirical, Fixed, LogNormal, Uniform
from workloads.limits import Limits, apply_limits
from workloads.loaders import detect_format, load_trace, read_length_column
from workloads.paths import REPO_ROOT
from workloads.spec import RequestSpec

DATA = Path(__file__).parent / "data" / "workloads"
TRACES = REPO_ROOT / "workloads" / "traces"
AZURE_CONV = "workloads/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
AZURE_CODE = "workloads/traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv"
MOONCAKE = "workloads/traces/mooncake_fast25/conversation_trace.jsonl"
ARXIV = (
    "workloads/traces/vidur_processed_traces/"
    "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"
)
SHAREGPT = (
    "workloads/traces/etalon_processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
)

SYNTHETIC = {
    "arrival": {"process": "poisson", "rate_per_s": 5.0},
    "lengths": {
        "input": {"dist": "lognormal", "mean": 1000, "cv": 1.0, "max": 8192},
        "output": {"dist": "uniform", "low": 10, "high": 500},
    },
    "num_requests": 300,
}


def build(data: dict, seed: int = 0, base_dir: Path = DATA):
    return build_workload(
        Section(data, "exp.yaml", "workload"), np.random.default_rng(seed), base_dir
    )


def with_(base: dict, **changes) -> dict:
    """A copy of ``base`` with top-level keys replaced (None deletes)."""
    out = {**base, **changes}
    return {k: v for k, v in out.items() if v is not None}


@pytest.fixture(scope="module")
def azure_conv():
    return load_trace(REPO_ROOT / AZURE_CONV)


@pytest.fixture(scope="module")
def mooncake_timed():
    start = time.perf_counter()
    trace = load_trace(REPO_ROOT / MOONCAKE)
    return trace, time.perf_counter() - start


@pytest.fixture(scope="module")
def mooncake(mooncake_timed):
    return mooncake_timed[0]


# ---------------------------------------------------------------------------- arrivals


def test_poisson_mean_rate_and_exponential_gaps():
    times = poisson_arrivals(np.random.default_rng(1), 20_000, rate_per_s=5.0)
    gaps = np.diff(times)
    assert times[0] == 0.0 and np.all(gaps >= 0)
    assert (len(times) - 1) / times[-1] == pytest.approx(5.0, rel=0.03)
    assert stats.kstest(gaps, "expon", args=(0, 1 / 5.0)).pvalue > 0.01


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_mean_rate_and_cv(cv):
    times = gamma_arrivals(np.random.default_rng(2), 50_000, rate_per_s=3.0, cv=cv)
    gaps = np.diff(times)
    assert (len(times) - 1) / times[-1] == pytest.approx(3.0, rel=0.04)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.06)
    # The shape test uses the raw gaps: at cv = 4 many gaps are far below one ulp of the
    # running time, so differences of the summed times are not the drawn gaps.
    shape = 1 / cv**2
    raw = Gamma(3.0, cv).gaps(np.random.default_rng(2), 50_000)
    assert stats.kstest(raw, "gamma", args=(shape, 0, 1 / (3.0 * shape))).pvalue > 0.01


def test_constant_exact_spacing():
    times = constant_arrivals(1000, rate_per_s=4.0)
    assert np.array_equal(np.diff(times), np.full(999, 0.25))
    times = constant_arrivals(1000, rate_per_s=3.0)
    assert np.array_equal(times, np.arange(1000) / 3.0)  # k / rate, no accumulated error


@pytest.mark.parametrize("process", [Poisson(5.0), Gamma(5.0, 3.0), Constant(5.0)])
def test_times_until_horizon_is_a_prefix_of_times(process):
    """Asking by horizon or by count gives the same first arrivals (prefix-stable)."""
    until = process.times_until(np.random.default_rng(3), 400.0, 10**6)
    counted = process.times(np.random.default_rng(3), len(until) + 50)
    assert until[-1] <= 400.0 < counted[len(until)]
    assert np.array_equal(until, counted[: len(until)])


def test_spread_quantized_spreads_groups_in_order():
    times = np.array([0.0, 0.0, 0.0, 3.0, 3.0, 4.0, 9.0])
    spread = spread_quantized(times, 3.0)
    # Group at 0: width 3 -> 0, 1, 2. Group at 3: width min(3, 4 - 3) = 1 -> 3, 3.5.
    # Singletons stay.
    assert spread.tolist() == [0.0, 1.0, 2.0, 3.0, 3.5, 4.0, 9.0]
    assert np.array_equal(spread_quantized(times, 0), times)


def test_repeat_and_replay():
    base = np.array([0.0, 1.0, 4.0])  # period = 4 * 3 / 2 = 6
    assert repeat_arrivals(base, 7).tolist() == [0, 1, 4, 6, 7, 10, 12]
    assert replay_arrivals(base, 2.0).tolist() == [0, 0.5, 2.0]


def test_trace_replay_rate_scale_2_halves_the_span_exactly():
    trace = {"path": AZURE_CONV}
    one = build({"trace": trace, "arrival": {"process": "trace"}})
    two = build({"trace": trace, "arrival": {"process": "trace", "rate_scale": 2}})
    t1 = np.array([r.arrival_s for r in one.requests])
    t2 = np.array([r.arrival_s for r in two.requests])
    assert len(t1) == len(t2) == 19366
    assert t2[-1] - t2[0] == (t1[-1] - t1[0]) / 2
    assert np.array_equal(t2, t1 / 2)
    assert two.info["mean_rate_per_s"] == pytest.approx(2 * one.info["mean_rate_per_s"])


def test_mooncake_replay_with_spread(mooncake):
    w = build(
        {"trace": {"path": MOONCAKE, "spread_quantized_s": 3}, "arrival": {"process": "trace"}}
    )
    times = np.array([r.arrival_s for r in w.requests])
    assert np.all(np.diff(times) >= 0)
    assert np.all((times >= mooncake.arrival_s) & (times < mooncake.arrival_s + 3.0))
    assert len(np.unique(times)) > 10 * len(np.unique(mooncake.arrival_s))
    assert w.info["spread_quantized_s"] == 3.0


# ---------------------------------------------------------------------------- loaders


def test_shipped_traces_are_byte_identical_copies():
    for line in (TRACES / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        assert hashlib.sha256((TRACES / name).read_bytes()).hexdigest() == digest, name
        folder = (TRACES / name).parent
        assert (folder / "README.md").is_file()
        assert list(folder.glob("LICENSE*")), f"no license beside {name}"


def test_azure_loader(azure_conv):
    assert (azure_conv.format, len(azure_conv)) == ("azure", 19366)
    assert azure_conv.num_prompt_tokens[:2].tolist() == [374, 396]
    assert azure_conv.num_output_tokens[:2].tolist() == [44, 109]
    assert azure_conv.arrival_s[:2].tolist() == [0.0, pytest.approx(4.314579, abs=1e-9)]
    assert azure_conv.arrival_s[-1] == pytest.approx(3501.721937, abs=1e-6)
    code = load_trace(REPO_ROOT / AZURE_CODE)
    assert len(code) == 8819
    assert (code.num_prompt_tokens[0], code.num_output_tokens[0]) == (4808, 10)
    assert code.arrival_s[1] == pytest.approx(0.052, abs=1e-9)


def test_mooncake_loader_keeps_hash_ids(mooncake):
    assert (mooncake.format, len(mooncake), mooncake.hash_block_size) == ("mooncake", 12031, 512)
    assert (mooncake.num_prompt_tokens[0], mooncake.num_output_tokens[0]) == (6758, 500)
    assert mooncake.hash_ids[0] == tuple(range(14))
    assert mooncake.hash_ids[1] == (0, *range(14, 28))
    assert mooncake.arrival_s[-1] == 3536.999
    w = build({"trace": {"path": MOONCAKE}, "arrival": {"process": "trace"}, "num_requests": 5})
    assert w.requests[1] == RequestSpec(0.0, 7322, 490, (0, *range(14, 28)))
    assert w.info["hash_block_size"] == 512
    assert isinstance(w.requests[0].hash_ids, tuple)


def test_mooncake_loads_fast(mooncake_timed):
    assert mooncake_timed[1] < 1.0  # about 0.1 s here: 12k JSON lines, 288k block ids


def test_length_only_loaders():
    arxiv = load_trace(REPO_ROOT / ARXIV)
    assert (arxiv.format, len(arxiv), arxiv.arrival_s) == ("lengths", 28257, None)
    assert (arxiv.num_prompt_tokens[0], arxiv.num_output_tokens[0]) == (3772, 54)
    sharegpt = load_trace(REPO_ROOT / SHAREGPT)
    assert (len(sharegpt), sharegpt.num_prompt_tokens[0], sharegpt.num_output_tokens[0]) == (
        30731,
        74,
        918,
    )


def test_small_fixtures_and_format_detection():
    assert detect_format(DATA / "azure_unsorted.csv") == "azure"
    assert detect_format(DATA / "vidur_small.csv") == "vidur"
    assert detect_format(DATA / "lengths_small.csv") == "lengths"
    assert detect_format(DATA / "mooncake_small.jsonl") == "mooncake"
    vidur = load_trace(DATA / "vidur_small.csv")
    assert vidur.arrival_s.tolist() == [0.0, 0.5, 2.0]
    # Lengths-only reading of a timestamped file ignores its times.
    assert load_trace(DATA / "vidur_small.csv", "lengths").arrival_s is None
    # Rows are stably sorted by time, and the move is counted.
    azure = load_trace(DATA / "azure_unsorted.csv")
    assert azure.arrival_s.tolist() == [0.0, 1.25, 1.5, 4.0]
    assert azure.num_prompt_tokens.tolist() == [10, 30, 20, 40]
    assert azure.num_reordered == 2
    # Blank lines are skipped; hash ids checked against 512-token blocks.
    moon = load_trace(DATA / "mooncake_small.jsonl")
    assert moon.arrival_s.tolist() == [0.0, 0.0, 3.0, 6.0]
    assert moon.hash_ids == [(0, 1), (0,), (0, 1, 2), (7,)]
    assert read_length_column(DATA / "mooncake_small.jsonl", "output_length").tolist() == [
        3,
        4,
        5,
        6,
    ]


# ---------------------------------------------------------------------------- lengths


def test_length_distributions():
    rng = np.random.default_rng(4)
    assert Fixed(7).sample(rng, 5).tolist() == [7] * 5
    uni = Uniform(10, 20).sample(rng, 50_000)
    assert (uni.min(), uni.max()) == (10, 20)  # both ends included
    assert uni.mean() == pytest.approx(15, rel=0.01)
    logn = LogNormal.from_mean(1000, cv=1.0).sample(rng, 200_000)
    assert logn.dtype == np.int64 and logn.min() >= 1
    assert logn.mean() == pytest.approx(1000, rel=0.02)
    assert logn.std() / logn.mean() == pytest.approx(1.0, rel=0.08)
    by_sigma = LogNormal.from_mean(500, sigma=0.5).sample(rng, 100_000)
    assert by_sigma.mean() == pytest.approx(500, rel=0.02)
    assert np.log(by_sigma).std() == pytest.approx(0.5, rel=0.03)
    clipped = LogNormal.from_mean(1000, cv=3.0, low=50, high=2000).sample(rng, 10_000)
    assert clipped.min() == 50 and clipped.max() == 2000
    values = np.array([3, 5, 11])
    emp = Empirical(values).sample(rng, 30_000)
    assert set(emp.tolist()) == {3, 5, 11}
    assert emp.mean() == pytest.approx(values.mean(), rel=0.02)


def test_synthetic_workload_lengths_and_info():
    w = build(with_(SYNTHETIC, num_requests=4000))
    prompt = np.array([r.num_prompt_tokens for r in w.requests])
    output = np.array([r.num_output_tokens for r in w.requests])
    assert prompt.min() >= 1 and prompt.max() <= 8192
    assert prompt.mean() == pytest.approx(1000, rel=0.05)
    assert output.min() >= 10 and output.max() <= 500
    assert output.mean() == pytest.approx(255, rel=0.03)
    assert all(type(r.arrival_s) is float and type(r.num_prompt_tokens) is int for r in w.requests)
    assert w.source == "synthetic:poisson"
    assert w.cuts == {}
    assert w.info["num_requests"] == 4000
    assert w.info["mean_input_tokens"] == pytest.approx(prompt.mean())
    assert w.info["arrival"] == "poisson" and w.info["rate_per_s"] == 5.0
    assert w.info["input_lengths"].startswith("lognormal(mean=1000")


def test_empirical_lengths_from_a_csv():
    w = build(
        {
            "arrival": {"process": "constant", "rate_per_s": 1},
            "lengths": {
                "input": {
                    "dist": "empirical",
                    "path": "lengths_small.csv",
                    "column": "num_total_tokens",
                },
                "output": {"dist": "fixed", "value": 1},
            },
            "num_requests": 2000,
        }
    )
    prompts = {r.num_prompt_tokens for r in w.requests}
    assert prompts == {110 * k for k in range(1, 11)}


# ---------------------------------------------------------------------------- limits and counts


def test_apply_limits_counts_each_request_once():
    times = np.arange(10.0)
    prompt = np.array([1, 1, 9, 1, 1, 9, 1, 1, 9, 9])
    output = np.ones(10, dtype=np.int64)
    index, cuts = apply_limits(Limits(3, 7.0, 5), times, prompt, output)
    # t > 7 cuts rows 8, 9 (both long, counted once, under duration); long rows 2, 5;
    # survivors 0, 1, 3, 4, 6, 7 -> first 3.
    assert index.tolist() == [0, 1, 3]
    assert cuts == {"duration_s": 2, "max_total_tokens": 2, "max_requests": 3}
    assert apply_limits(Limits(), times, prompt, output)[1] == {}


def test_limits_on_a_trace_exact_counts():
    w = build(
        {
            "trace": {"path": "lengths_small.csv"},
            "arrival": {"process": "constant", "rate_per_s": 1.0},  # t = 0, 1, ..., 9
            "limits": {"duration_s": 7, "max_total_tokens": 600, "max_requests": 3},
        }
    )
    # t <= 7 keeps rows 1..8 (totals 110..880); <= 600 keeps 110..550; first 3 of those.
    assert [r.num_prompt_tokens for r in w.requests] == [100, 200, 300]
    assert w.cuts == {"duration_s": 2, "max_total_tokens": 3, "max_requests": 2}
    assert len(w.requests) + sum(w.cuts.values()) == 10


def test_num_requests_on_a_trace():
    base = {
        "trace": {"path": "lengths_small.csv"},
        "arrival": {"process": "poisson", "rate_per_s": 1},
    }
    taken = build({**base, "num_requests": 4})
    assert [r.num_prompt_tokens for r in taken.requests] == [100, 200, 300, 400]
    assert taken.cuts == {"num_requests": 6}
    short = build({**base, "num_requests": 25})  # no silent cycling
    assert len(short.requests) == 10 and short.info["num_requests_short"] == 15
    cycled = build(
        {**base, "num_requests": 25, "trace": {"path": "lengths_small.csv", "repeat": True}}
    )
    assert [r.num_prompt_tokens for r in cycled.requests][9:12] == [1000, 100, 200]
    assert cycled.cuts == {} and "num_requests_short" not in cycled.info


def test_repeated_mooncake_shifts_hash_ids_and_period():
    w = build(
        {
            "trace": {"path": "mooncake_small.jsonl", "repeat": True},
            "arrival": {"process": "trace"},
            "num_requests": 6,
        }
    )
    assert [r.hash_ids for r in w.requests] == [(0, 1), (0,), (0, 1, 2), (7,), (8, 9), (8,)]
    assert [r.arrival_s for r in w.requests] == [0, 0, 3, 6, 8, 8]  # period 6 * 4 / 3 = 8


def test_duration_stops_an_endless_source_without_counting():
    w = build(with_(SYNTHETIC, num_requests=None, limits={"duration_s": 60}))
    assert w.requests[-1].arrival_s <= 60
    assert w.cuts == {"duration_s": 0}
    assert 200 < len(w.requests) < 400
    capped = build(with_(SYNTHETIC, num_requests=None, limits={"max_requests": 17}))
    assert len(capped.requests) == 17 and capped.cuts == {"max_requests": 0}


def test_zero_output_rows_are_clamped_or_dropped_and_counted():
    base = {"arrival": {"process": "constant", "rate_per_s": 1}}
    clamp = build({**base, "trace": {"path": "lengths_zero_output.csv"}})
    assert [r.num_output_tokens for r in clamp.requests] == [5, 1, 7, 1]
    assert clamp.info["zero_output_clamped"] == 2
    drop = build({**base, "trace": {"path": "lengths_zero_output.csv", "zero_output": "drop"}})
    assert [r.num_prompt_tokens for r in drop.requests] == [10, 30]
    assert drop.cuts == {"zero_output": 2}


def test_yaml_file_end_to_end_and_relative_to_its_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the fixture path resolves against the YAML folder, not cwd
    path = DATA / "experiment.yaml"
    sec = Section(yaml.safe_load(path.read_text()), path.name).section("workload")
    w = build_workload(sec, np.random.default_rng(0), path.parent)
    assert [r.arrival_s for r in w.requests][:3] == [0.0, 0.5, 1.0]
    # 25 requests cycle through 10 rows; only row 10 (110 + 990 = 1100 tokens) is over 1000,
    # and it comes up twice.
    assert w.cuts == {"max_total_tokens": 2} and len(w.requests) == 23


def test_paths_resolve_yaml_folder_then_cwd_then_repo(tmp_path, monkeypatch):
    yaml_dir = tmp_path / "exp"
    cwd = tmp_path / "cwd"
    yaml_dir.mkdir()
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    (cwd / "t.csv").write_text("num_prefill_tokens,num_decode_tokens\n5,5\n")
    spec = {"arrival": {"process": "constant", "rate_per_s": 1}, "trace": {"path": "t.csv"}}
    assert build(spec, base_dir=yaml_dir).requests[0].num_prompt_tokens == 5  # from cwd
    (yaml_dir / "t.csv").write_text("num_prefill_tokens,num_decode_tokens\n6,6\n")
    assert build(spec, base_dir=yaml_dir).requests[0].num_prompt_tokens == 6  # YAML folder first
    repo = {**spec, "trace": {"path": AZURE_CODE}, "num_requests": 1}
    assert build(repo, base_dir=yaml_dir).requests[0].num_prompt_tokens == 4808  # repo root


@pytest.mark.parametrize("path", sorted((REPO_ROOT / "workloads" / "examples").glob("*.yaml")))
def test_shipped_examples_build(path):
    sec = Section(yaml.safe_load(path.read_text()), path.name).section("workload")
    w = build_workload(sec, np.random.default_rng(0), path.parent)
    assert w.requests and w.info["num_requests"] == len(w.requests)
    # info and cuts go into summary.json as they are: plain JSON types only.
    assert json.loads(json.dumps({"info": w.info, "cuts": w.cuts})) == {
        "info": w.info,
        "cuts": w.cuts,
    }


# ---------------------------------------------------------------------------- randomness


def test_same_seed_identical_and_different_seed_different():
    shuffled = {
        "trace": {"path": SHAREGPT, "order": "shuffle"},
        "arrival": {"process": "gamma", "rate_per_s": 4, "cv": 2},
        "num_requests": 200,
    }
    for spec in (SYNTHETIC, shuffled):
        a, b, c = build(spec, seed=7), build(spec, seed=7), build(spec, seed=8)
        assert a.requests == b.requests and a.info == b.info
        assert [r.arrival_s for r in a.requests] != [r.arrival_s for r in c.requests]
        assert [r.num_prompt_tokens for r in a.requests] != [
            r.num_prompt_tokens for r in c.requests
        ]


def test_streams_are_independent():
    """Changing the output distribution moves neither arrival times nor prompt lengths."""
    other = {**SYNTHETIC["lengths"], "output": {"dist": "lognormal", "mean": 50, "sigma": 1}}
    a = build(SYNTHETIC)
    b = build(with_(SYNTHETIC, lengths=other))
    assert [(r.arrival_s, r.num_prompt_tokens) for r in a.requests] == [
        (r.arrival_s, r.num_prompt_tokens) for r in b.requests
    ]
    c = build(with_(SYNTHETIC, arrival={"process": "constant", "rate_per_s": 1}))
    assert [r.num_output_tokens for r in a.requests] == [r.num_output_tokens for r in c.requests]


def test_build_does_not_draw_from_the_given_rng():
    rng = np.random.default_rng(11)
    build_workload(Section(SYNTHETIC, "exp.yaml", "workload"), rng, DATA)
    assert rng.random() == np.random.default_rng(11).random()
    kids = child_streams(np.random.default_rng(5), 2)
    assert kids[0].random() != kids[1].random()


# ---------------------------------------------------------------------------- config errors

BAD_CONFIGS = {
    "unknown top key": (with_(SYNTHETIC, num_request=3), "workload.num_request", "unknown key"),
    "unknown nested key": (
        with_(
            SYNTHETIC,
            lengths={**SYNTHETIC["lengths"], "output": {"dist": "fixed", "value": 3, "valu": 3}},
        ),
        "workload.lengths.output.valu",
        "unknown key",
    ),
    "wrong type": (
        with_(SYNTHETIC, arrival={"process": "poisson", "rate_per_s": "fast"}),
        "workload.arrival.rate_per_s",
        "expected a number",
    ),
    "negative rate": (
        with_(SYNTHETIC, arrival={"process": "poisson", "rate_per_s": -1}),
        "workload.arrival.rate_per_s",
        "> 0",
    ),
    "zero rate": (
        with_(SYNTHETIC, arrival={"process": "constant", "rate_per_s": 0}),
        "workload.arrival.rate_per_s",
        "> 0",
    ),
    "unknown process": (
        with_(SYNTHETIC, arrival={"process": "weibull", "rate_per_s": 1}),
        "workload.arrival.process",
        "expected one of",
    ),
    "key of another process": (
        with_(SYNTHETIC, arrival={"process": "poisson", "rate_per_s": 1, "cv": 2}),
        "workload.arrival.cv",
        "not used by process poisson",
    ),
    "gamma without cv": (
        with_(SYNTHETIC, arrival={"process": "gamma", "rate_per_s": 1}),
        "workload.arrival.cv",
        "required",
    ),
    "no lengths without a trace": (with_(SYNTHETIC, lengths=None), "workload.lengths", "required"),
    "missing output length": (
        with_(SYNTHETIC, lengths={"input": {"dist": "fixed", "value": 3}}),
        "workload.lengths.output",
        "required",
    ),
    "lognormal cv and sigma": (
        with_(
            SYNTHETIC,
            lengths={
                **SYNTHETIC["lengths"],
                "input": {"dist": "lognormal", "mean": 9, "cv": 1, "sigma": 1},
            },
        ),
        "workload.lengths.input.cv",
        "exactly one",
    ),
    "uniform high < low": (
        with_(
            SYNTHETIC,
            lengths={**SYNTHETIC["lengths"], "output": {"dist": "uniform", "low": 9, "high": 3}},
        ),
        "workload.lengths.output.high",
        "high >= low",
    ),
    "zero fixed length": (
        with_(SYNTHETIC, lengths={**SYNTHETIC["lengths"], "output": {"dist": "fixed", "value": 0}}),
        "workload.lengths.output.value",
        ">= 1",
    ),
    "negative num_requests": (with_(SYNTHETIC, num_requests=-5), "workload.num_requests", ">= 1"),
    "endless source": (with_(SYNTHETIC, num_requests=None), "workload.num_requests", "never ends"),
    "negative duration": (
        with_(SYNTHETIC, limits={"duration_s": -1}),
        "workload.limits.duration_s",
        "> 0",
    ),
    "too many arrivals": (
        with_(SYNTHETIC, num_requests=None, limits={"duration_s": 1e9}),
        "workload.limits.duration_s",
        "more than",
    ),
    "everything cut": (
        with_(SYNTHETIC, limits={"max_total_tokens": 2}),
        "workload: no requests are left",
        "max_total_tokens",
    ),
    "missing trace file": (
        {"trace": {"path": "no_such_trace.csv"}, "arrival": {"process": "trace"}},
        "workload.trace.path",
        "no_such_trace.csv",
    ),
    "missing empirical file": (
        with_(
            SYNTHETIC,
            lengths={
                **SYNTHETIC["lengths"],
                "input": {"dist": "empirical", "path": "nope.csv", "column": "x"},
            },
        ),
        "workload.lengths.input.path",
        "nope.csv",
    ),
    "empirical missing column": (
        with_(
            SYNTHETIC,
            lengths={
                **SYNTHETIC["lengths"],
                "input": {"dist": "empirical", "path": "lengths_small.csv", "column": "x"},
            },
        ),
        "workload.lengths.input.path",
        "missing column(s) ['x']",
    ),
    "bad format name": (
        {
            "trace": {"path": "lengths_small.csv", "format": "sharegpt"},
            "arrival": {"process": "trace"},
        },
        "workload.trace.format",
        "expected one of",
    ),
    "replay of a lengths-only trace": (
        {"trace": {"path": "lengths_small.csv"}, "arrival": {"process": "trace"}},
        "workload.arrival.process",
        "no timestamps",
    ),
    "replay without a trace": (
        with_(SYNTHETIC, arrival={"process": "trace"}),
        "workload.arrival.process",
        "needs workload.trace",
    ),
    "spread without replay": (
        {
            "trace": {"path": "vidur_small.csv", "spread_quantized_s": 3},
            "arrival": {"process": "poisson", "rate_per_s": 1},
        },
        "workload.trace.spread_quantized_s",
        "only used with",
    ),
    "shuffle with replay": (
        {"trace": {"path": "vidur_small.csv", "order": "shuffle"}, "arrival": {"process": "trace"}},
        "workload.trace.order",
        "synthetic arrival",
    ),
    "input override with hash_ids": (
        {
            "trace": {"path": "mooncake_small.jsonl"},
            "arrival": {"process": "trace"},
            "lengths": {"input": {"dist": "fixed", "value": 5}},
        },
        "workload.lengths.input",
        "hash_ids",
    ),
    "repeat wrong type": (
        {"trace": {"path": "vidur_small.csv", "repeat": "yes"}, "arrival": {"process": "trace"}},
        "workload.trace.repeat",
        "true or false",
    ),
    "arrival not a mapping": (with_(SYNTHETIC, arrival="poisson"), "workload.arrival", "mapping"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_config_names_file_and_key(case):
    data, key, fragment = BAD_CONFIGS[case]
    with pytest.raises(ConfigError) as err:
        build(data)
    message = str(err.value)
    assert message.startswith("exp.yaml: "), message
    assert key in message, message
    assert fragment in message, message


BAD_TRACES = {  # file: (format, fragments the message must contain)
    "bad_azure_int.csv": ("auto", "line 3 (data row 2)", "'ContextTokens'", "'12x'"),
    "bad_azure_timestamp.csv": ("auto", "line 4 (data row 3)", "'TIMESTAMP'", "'yesterday'"),
    "bad_azure_missing_column.csv": (
        "azure",
        "line 1 (header)",
        "missing column(s) ['GeneratedTokens']",
    ),
    "bad_azure_negative_output.csv": ("auto", "line 2 (data row 1)", "'GeneratedTokens'", ">= 0"),
    "bad_mooncake_json.jsonl": ("auto", "line 2 (data row 2)", "not valid JSON"),
    "bad_mooncake_missing_field.jsonl": (
        "mooncake",
        "line 2 (data row 2)",
        "'output_length'",
        "missing",
    ),
    "bad_mooncake_hash_count.jsonl": ("auto", "line 2 (data row 2)", "'hash_ids'", "= 2 block"),
    "bad_mooncake_float_length.jsonl": ("auto", "line 2 (data row 2)", "'input_length'", "10.5"),
    "bad_vidur_negative_time.csv": ("auto", "line 3 (data row 2)", "'arrived_at'", ">= 0"),
    "bad_lengths_zero_prompt.csv": (
        "lengths",
        "line 3 (data row 2)",
        "'num_prefill_tokens'",
        "positive",
    ),
    "bad_lengths_extra_field.csv": ("auto", "line 3 (data row 2)", "expected 2 fields"),
    "bad_lengths_short_row.csv": ("auto", "line 3 (data row 2)", "expected 2 fields"),
    "bad_lengths_fraction.csv": ("auto", "line 3 (data row 2)", "'num_prefill_tokens'", "'12.5'"),
    "bad_unknown_columns.csv": ("auto", "cannot tell the trace format", "['prompt', 'completion']"),
    "bad_empty.csv": ("auto", "empty"),
}


@pytest.mark.parametrize("name", list(BAD_TRACES))
def test_malformed_trace_names_file_row_and_column(name):
    fmt, *fragments = BAD_TRACES[name]
    with pytest.raises(ConfigError) as err:
        build(
            {
                "trace": {"path": name, "format": fmt},
                "arrival": {"process": "poisson", "rate_per_s": 1},
            }
        )
    message = str(err.value)
    assert message.startswith("exp.yaml: workload.trace.path: "), message
    assert name in message, message
    for fragment in fragments:
        assert fragment in message, message


def test_integral_float_lengths_are_accepted(tmp_path):
    path = tmp_path / "floats.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n12.0,3\n")
    assert load_trace(path).num_prompt_tokens.tolist() == [12]


@pytest.mark.parametrize(
    "stamps",
    [
        ("2023-11-16 18:15:46Z", "2023-11-16 18:15:47+00:00", "2023-11-16 18:15:49+0000"),
        ("2023-11-16T10:15:46-08:00", "2023-11-16T10:15:47-08:00", "2023-11-16T10:15:49-08:00"),
        ("2023-11-16", "2023-11-16T00:00:01", "2023-11-16 00:00:03"),
    ],
    ids=["utc-written-three-ways", "one-non-utc-zone", "dates-and-naive-times"],
)
def test_azure_times_in_one_zone_are_accepted(tmp_path, stamps):
    """The mixed-zone refusal compares offsets, not text, and a date's dashes are no offset."""
    path = tmp_path / "t.csv"
    rows = "".join(f"{s},10,5\n" for s in stamps)
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    assert load_trace(path, "azure").arrival_s.tolist() == [0.0, 1.0, 3.0]
