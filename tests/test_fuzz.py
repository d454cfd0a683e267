"""Property-based fuzzing (hypothesis) of the input readers and of the allocator + policy pair.

Why: the bad-input corpus (test_bad_inputs.py) holds the mistakes someone thought of; these
tests try the ones nobody did. Two properties:

* a mutated experiment config, trace file or ``--set`` value either runs (a short horizon) or
  fails with a `ConfigError` (exit 2): any other exception is a bug;
* random operation sequences on every KV allocator, and random small workloads through every
  policy on a small cache, keep the invariants: every block is accounted for and returned, no
  request is lost, the step budgets hold.

Derandomized with modest example counts, so CI is deterministic and the file runs in seconds.
"""

from __future__ import annotations

import contextlib
import copy
import io
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from policies import POLICIES
from simulator.cli import main
from simulator.errors import ConfigError
from simulator.kv.contiguous import ContiguousAllocator
from simulator.kv.paged import PagedAllocator, PagedTableAllocator
from simulator.kv.prefix import PrefixCachingAllocator
from simulator.request import Request
from simulator.runner import build, simulate
from workloads.loaders import load_trace

HERE = Path(__file__).resolve().parent
BASE = yaml.safe_load((HERE / "bad_inputs" / "base.yaml").read_text())
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _paths(node, prefix=""):
    for key, value in node.items():
        path = f"{prefix}{key}"
        yield path
        if isinstance(value, dict):
            yield from _paths(value, path + ".")


#: every key of the base config, plus keys it leaves at their defaults and one unknown key
KEYS = sorted(set(_paths(BASE)) | {
    "sim.horizon_s", "sim.coalesce", "cluster.replicas", "cluster.mode", "cluster.router.name",
    "kv_cache.num_blocks", "kv_cache.reserve", "kv_cache.prefix_caching", "kv_cache.on_oversize",
    "scheduler.batch_size", "scheduler.max_wait_s", "scheduler.max_num_batched_tokens",
    "scheduler.preemption", "scheduler.num_speculative_tokens", "workload.limits.duration_s",
    "workload.limits.max_total_tokens", "workload.limits.max_requests", "workload.arrival.cv",
    "workload.trace.path", "latency.step_s", "hardware.price_per_gpu_hour", "scheduler.bogus",
    "hardware.usd_per_kwh",
})  # fmt: skip
WORDS = ["continuous", "static", "dynamic", "chunked_prefill", "speculative", "vllm", "paged",
         "contiguous", "poisson", "gamma", "constant", "trace", "auto", "roofline", "profile",
         "fixed", "uniform", "lognormal", "empirical", "h200", "h100-sxm", "llama-3-8b",
         "max_model_len", "output", "disaggregated", "least_loaded", ""]  # fmt: skip
VALUES = st.one_of(
    st.integers(1, 64),  # plausible values first, so that a good share of mutants still run
    st.sampled_from(WORDS),
    st.none(),
    st.booleans(),
    st.integers(-3, 3000),
    st.sampled_from([0, -1, 2**31, 2**63, 10**9, 10**12]),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.sampled_from(WORDS),
    st.text(max_size=6),
    st.lists(st.integers(-2, 5), max_size=3),
    st.dictionaries(st.sampled_from(["dist", "value", "process", "rate_per_s", "x"]),
                    st.one_of(st.integers(-1, 50), st.sampled_from(WORDS)), max_size=3),
)  # fmt: skip
DELETE = object()
MUTATIONS = st.lists(
    st.tuples(st.sampled_from(KEYS), st.one_of(VALUES, st.just(DELETE))), min_size=1, max_size=3
)


def mutate(config: dict, mutations) -> dict:
    out = copy.deepcopy(config)
    for key, value in mutations:
        *parents, last = key.split(".")
        node = out
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        if value is DELETE:
            node.pop(last, None)
        else:
            node[last] = copy.deepcopy(value)
    return out


@settings(FUZZ, max_examples=200)
@given(MUTATIONS)
def test_mutated_configs_run_or_raise_config_error(tmp_path, mutations):
    config = mutate({**BASE, "sim": {"horizon_s": 2.0}}, mutations)
    try:
        built = build(config, "fuzz.yaml", tmp_path)
    except ConfigError as e:
        assert e.where and e.message
        event("config error")
        return
    event("ran")
    summary = simulate(built).summary
    r = summary["requests"]
    assert r["completed"] + r["rejected"] + r["unfinished"] == r["arrived"]


SET_TEXTS = st.one_of(
    st.sampled_from(["-1", "0", "1e9", "nan", "~", "[]", "{}", "[1, 2]", "{a: 1}", "'x'", "true",
                     "\"", "{", "!!binary AAA", "&a [*a]", "1:2", "0x10", "1_000"]),
    st.text(max_size=8),
)  # fmt: skip


def _run_cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, err.getvalue()


@FUZZ
@given(st.sampled_from(KEYS), SET_TEXTS)
def test_set_values_run_or_exit_2_naming_set(tmp_path, key, text):
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({**BASE, "sim": {"horizon_s": 2.0}}))
    item = f"{key}={text}"
    code, err = _run_cli(["run", str(base), "--set", item, "--out", str(tmp_path / "o"),
                          "--quiet", "--no-steps"])  # fmt: skip
    assert code in (0, 2), err
    assert "Traceback" not in err
    if code == 2 and f": {key}: " in err:  # an error about exactly the key that --set gave
        assert f"--set {item}" in err, err


AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:15:51.2000000,879,0\n"
)
MOONCAKE = (
    '{"timestamp": 0, "input_length": 600, "output_length": 12, "hash_ids": [1, 2]}\n'
    '{"timestamp": 250, "input_length": 100, "output_length": 3, "hash_ids": [1]}\n'
)
VIDUR = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n0.5,20,1\n"
EDITS = st.lists(
    st.tuples(
        st.sampled_from(["insert", "delete", "replace"]),
        st.integers(0, 10_000),
        st.sampled_from(list(',\n"-.e0159 x[]{}:\x00\xe9\ufeff\r') + ["nan", "inf", "\u2028"]),
    ),
    min_size=1,
    max_size=4,
)


def edit(text: str, edits) -> str:
    for kind, pos, piece in edits:
        i = pos % (len(text) + 1)
        if kind == "insert":
            text = text[:i] + piece + text[i:]
        elif kind == "delete":
            text = text[:i] + text[i + 1 :]
        else:
            text = text[:i] + piece + text[i + 1 :]
    return text


@settings(FUZZ, max_examples=150)
@given(st.sampled_from([("t.csv", AZURE), ("t.jsonl", MOONCAKE), ("v.csv", VIDUR)]), EDITS,
       st.sampled_from(["utf-8", "latin-1", "utf-16"]))  # fmt: skip
def test_mutated_traces_load_or_raise_config_error(tmp_path, file, edits, encoding):
    name, text = file
    path = tmp_path / name
    path.write_bytes(edit(text, edits).encode(encoding, errors="replace"))
    try:
        trace = load_trace(path)
    except ConfigError as e:
        assert str(path) in e.one_line()
        event("trace error")
        return
    event("loaded")
    assert (trace.num_prompt_tokens > 0).all() and (trace.num_output_tokens >= 0).all()
    if trace.arrival_s is not None:
        assert (trace.arrival_s >= 0).all()
        assert (trace.arrival_s[1:] >= trace.arrival_s[:-1]).all()


# ---- allocators and policies ------------------------------------------------------------------

OPS = st.lists(
    st.tuples(st.sampled_from(["allocate", "extend", "free", "compute"]), st.integers(0, 5),
              st.integers(1, 400)),
    max_size=60,
)  # fmt: skip


def _allocators(num_blocks: int, block_size: int):
    return [
        PagedAllocator(num_blocks, block_size),
        PagedTableAllocator(num_blocks, block_size),
        ContiguousAllocator(num_blocks, block_size, "prompt_plus_output", 4096),
        ContiguousAllocator(num_blocks, block_size, "max_model_len", 256),
        PrefixCachingAllocator(num_blocks, block_size, shared_prefix_tokens=64),
    ]


def _check_blocks(kv, reqs) -> None:
    """Every block is free, evictable or held; a held block's holders are its reference count
    (the counting allocator: every block is free or counted by one request)."""
    assert kv.num_used_blocks == kv.num_blocks - kv.num_free_blocks
    if isinstance(kv, PagedAllocator):
        assert all(r.block_table == [] and r.kv_blocks == kv.held(r) >= 0 for r in reqs)
        assert 0 <= kv.num_used_blocks == sum(r.kv_blocks for r in reqs) <= kv.num_blocks
        return
    assert all(r.kv_blocks == 0 for r in reqs)
    held: dict[int, int] = {}
    for r in reqs:
        for b in r.block_table:
            held[b] = held.get(b, 0) + 1
    free = list(kv._free)
    assert len(set(free)) == len(free) and not set(free) & set(held)
    if isinstance(kv, PrefixCachingAllocator):
        assert all(kv._ref[b] == n for b, n in held.items())
        assert not set(kv._evictable) & (set(held) | set(free))
        assert kv.num_free_blocks + len(held) == kv.num_blocks
    else:
        assert all(n == 1 for n in held.values())
        assert len(free) + len(held) == kv.num_blocks
    assert kv.num_used_blocks == kv.num_blocks - kv.num_free_blocks


def _apply(kv, req, op: str, n: int) -> None:
    before = (list(req.block_table), req.kv_blocks, kv.num_free_blocks)
    if op == "allocate":  # succeeds exactly when blocks_needed says it fits
        extent = kv.extent_tokens(req) if isinstance(kv, ContiguousAllocator) else n
        fits = kv.blocks_needed(req, n) <= kv.num_free_blocks and n <= extent
        assert kv.allocate(req, n) == fits
        if fits:
            assert kv.capacity(req) >= n
        else:  # no partial effect
            assert (list(req.block_table), req.kv_blocks, kv.num_free_blocks) == before
    elif op == "extend":
        cap = kv.extend(req)
        if cap < 0:
            assert (list(req.block_table), req.kv_blocks, kv.num_free_blocks) == before
        else:
            assert cap == kv.capacity(req)
    elif op == "compute":  # the replica's commit: tokens now in the cache (never past capacity)
        req._num_computed = min(max(req.num_computed, n), kv.capacity(req))
    else:
        kv.free(req)
        req._num_computed = 0
        assert req.block_table == [] and req.kv_blocks == 0


@settings(FUZZ, max_examples=150)
@given(st.integers(1, 40), st.sampled_from([1, 4, 16]), OPS)
def test_allocator_operation_sequences_keep_blocks_accounted(num_blocks, block_size, ops):
    for kv in _allocators(num_blocks, block_size):
        reqs = [Request(i, 0.0, 50 + 37 * i, 1 + 13 * i, (1, 2) if i % 2 else None)
                for i in range(6)]  # fmt: skip
        for op, i, n in ops:
            _apply(kv, reqs[i], op, n)
            _check_blocks(kv, reqs)
        for r in reqs:
            kv.free(r)
        assert kv.num_free_blocks == kv.num_blocks, kv.kind


@settings(FUZZ, max_examples=150)
@given(st.integers(1, 40), st.sampled_from([1, 4, 16]), OPS, st.integers(0, 40))
def test_counting_and_table_paged_allocators_decide_alike(num_blocks, block_size, ops, reserve):
    """`PagedAllocator` (counts) answers every call as `PagedTableAllocator` (ids) does, and
    each request holds as many blocks under one as under the other: what lets the engine run
    on counts while the real-GPU executor gets ids."""
    count, table = (
        PagedAllocator(num_blocks, block_size),
        PagedTableAllocator(num_blocks, block_size),
    )
    sides = [(kv, [Request(i, 0.0, 50 + 37 * i, 1 + 13 * i) for i in range(6)])
             for kv in (count, table)]  # fmt: skip
    for op, i, n in ops:
        answers = []
        for kv, reqs in sides:
            req = reqs[i]
            if op == "allocate":
                fits = kv.can_allocate(req, n, reserve)
                answers.append((kv.blocks_needed(req, n), fits, kv.allocate(req, n)))
            elif op == "extend":
                answers.append(kv.extend(req))
            elif op == "free":
                kv.free(req)
            answers.append((kv.capacity(req), kv.num_used_blocks, kv.num_free_blocks))
        assert answers[: len(answers) // 2] == answers[len(answers) // 2 :]
        assert [count.held(r) for r in sides[0][1]] == [len(r.block_table) for r in sides[1][1]]


POLICY_PARAMS = {
    "continuous": {"max_num_seqs": 4, "max_num_batched_tokens": 600},
    "chunked_prefill": {"max_num_seqs": 4, "max_num_batched_tokens": 64},
    "static": {"batch_size": 3},
    "dynamic": {"batch_size": 3, "max_wait_s": 0.01},
    "speculative": {"max_num_seqs": 4, "max_num_batched_tokens": 600},
    "vllm": {"max_num_seqs": 4, "max_num_batched_tokens": 64},
}
WORKLOADS = st.fixed_dictionaries({
    "policy": st.sampled_from(sorted(POLICIES)),
    "allocator": st.sampled_from(["paged", "contiguous", "prefix"]),
    "num_blocks": st.integers(6, 60),
    "rate": st.floats(0.5, 200.0),
    "input": st.integers(1, 300),
    "output": st.integers(1, 60),
    "n": st.integers(1, 30),
    "seed": st.integers(0, 2**16),
})  # fmt: skip


def _policy_config(w: dict) -> dict:
    kv = {"allocator": "paged", "block_size": 16, "num_blocks": w["num_blocks"],
          "on_oversize": "reject"}  # fmt: skip
    if w["allocator"] == "contiguous":
        kv.update(allocator="contiguous", reserve="prompt_plus_output")
    elif w["allocator"] == "prefix":
        kv.update(prefix_caching={"shared_prefix_tokens": 64})
    return {
        **BASE,
        "seed": w["seed"],
        "model": {"name": "tiny", "num_layers": 2, "hidden_size": 256, "num_heads": 4,
                  "num_kv_heads": 2, "intermediate_size": 512, "vocab_size": 1000,
                  "max_model_len": 512},
        "scheduler": {"policy": w["policy"], **POLICY_PARAMS[w["policy"]]},
        "kv_cache": kv,
        "workload": {
            "arrival": {"process": "poisson", "rate_per_s": w["rate"]},
            "lengths": {"input": {"dist": "uniform", "low": 1, "high": w["input"]},
                        "output": {"dist": "uniform", "low": 1, "high": w["output"]}},
            "num_requests": w["n"],
        },
    }  # fmt: skip


@settings(FUZZ, max_examples=150)
@given(WORKLOADS)
def test_policies_on_small_caches_lose_nothing_and_respect_budgets(tmp_path, w):
    config = _policy_config(w)
    built = build(config, "fuzz.yaml", tmp_path)
    res = simulate(built)  # the runner itself asserts every block is back and no one is left
    r = res.summary["requests"]
    assert r["completed"] + r["rejected"] == r["arrived"] == w["n"]
    assert r["unfinished"] == 0
    steps = res.steps
    assert (steps["kv_blocks_used"] <= w["num_blocks"]).all()
    params = POLICY_PARAMS[w["policy"]]
    seqs = steps["prefill_seqs"] + steps["decode_seqs"]
    assert (seqs <= params.get("max_num_seqs", params.get("batch_size", 10**9))).all()
    if w["policy"] in ("chunked_prefill", "vllm"):  # one budget for decodes and chunks
        assert (steps["prefill_tokens"] + steps["decode_seqs"] <= 64).all()
    elif "max_num_batched_tokens" in params:
        assert (steps["prefill_tokens"] <= params["max_num_batched_tokens"]).all()


RUN_OK = HERE / "bad_inputs" / "run_ok"
RUN_FILES = ["summary.json", "config.yaml", "steps.csv", "requests.csv"]


@settings(FUZZ, max_examples=80)
@given(st.sampled_from(RUN_FILES), EDITS, st.sampled_from(["compare", "timeline"]))
def test_edited_run_folders_read_back_or_exit_2(tmp_path, name, edits, command):
    """compare and timeline on a run folder with one file edited: exit 0 or 2, no traceback."""
    run = Path(tempfile.mkdtemp(dir=tmp_path))  # one folder per example (tmp_path is shared)
    for f in RUN_FILES:
        text = (RUN_OK / f).read_text()
        (run / f).write_text(edit(text, edits) if f == name else text)
    argv = (["compare", str(run), str(RUN_OK)] if command == "compare"
            else ["timeline", str(run), "--out", str(run / "t.json")])  # fmt: skip
    code, err = _run_cli(argv)
    assert code in (0, 2), err
    assert "Traceback" not in err
