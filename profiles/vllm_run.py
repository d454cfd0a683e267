"""Drive vLLM in-process as ``vllm serve`` builds it, and record what it does (needs vLLM + GPU).

``python -m profiles.vllm_run JOB.json --out DIR`` starts one `AsyncLLM` engine (V1, the
``OPENAI_API_SERVER`` usage context, so the defaults are those of ``vllm serve``: async
scheduling, chunked prefill with 8192 batched tokens, prefix caching, FlashAttention 3, full and
piecewise CUDA graphs) on a generated ``config.json`` with dummy weights, then runs the job's
phases on it:

* ``{"name", "kind": "profile", "seed", "limit"?, "max_scenario_tokens"?, "repeats"?,
  "resume"?, "passes_per_engine"?}``: the scenarios of `profiles.vllm_grid` (the first ``limit``
  only, for a smoke test), one after another with the engine idle between, each saved as it
  finishes (``resume``: skip those a previous run into the same folder finished);
  ``passes_per_engine: N`` (needs ``resume``) ends the process after N passes over the grid
  with the exit status `MORE_PASSES`, and the caller starts a fresh engine for the next N
  (`run_until_done`, `profiles/device_vllm.sh`), so a table's launches come from several
  engine processes (`run_profile` says why);
* ``{"name", "kind": "replay", "arrivals": FILE}``: requests submitted at their arrival times,
  one asyncio task per request, streaming tokens (what a serving client sees).

Every engine step is recorded by `profiles.vllm_steps` (composition, plan and completion time on
the frontend's monotonic clock). Per request: submit time, and the time and token count of each
streamed output. Written under DIR: ``engine.json`` (versions, effective engine config, KV
capacity), ``steps.jsonl.<pid>``, ``<phase>.json.gz`` (requests + phase window + scenarios),
``energy.<pid>.jsonl`` (every GPU's cumulative energy counter, sampled: `profiles.gpu_energy`).

A job's ``precision`` (``{"weights": bf16|fp8|int4, "kv_cache_dtype": bf16|fp8}``, default
bf16) becomes engine arguments (`profiles.hf_config.engine_precision`); the model folder's
``config.json`` must have been written for the same weights (an int4 checkpoint config). A job
with ``"routing": "token_dependent"`` re-draws its MoE routers and its token embedding after
the dummy load (`profiles.dummy_routing`), skewed by ``"routing_skew": s`` (a Zipf exponent),
and writes what its routers do with random tokens into engine.json (``routing_at_load``). A
job with ``shard_tp: K`` runs at TP1 a
``config.json`` of one GPU's shard of a K-way TP layout (`profiles.hf_config.shard_config`);
the table built from it adds the layout's collectives (`simulator.latency.shard`).

Nothing here fits or judges anything: it only records. Requests use random token ids, exact
output lengths (``min_tokens = max_tokens``, ``ignore_eos``) and no detokenization.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from profiles import gpu_energy, vllm_grid, vllm_steps
from profiles.engine_jobs import job_precision
from profiles.hf_config import engine_precision

SERVE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "VLLM_WORKER_MULTIPROC_METHOD": "fork",
}
#: kernel switches a caller may set, recorded in engine.json when set: the carried vLLM lacks
#: DeepGEMM's JIT headers, so block-FP8 models run with ``VLLM_USE_DEEP_GEMM=0`` (CUTLASS
#: block-scaled GEMMs; DeepSeek-V3's shard table, profiles/README.md)
RECORDED_ENV = ("VLLM_USE_DEEP_GEMM",)
#: NVLink multicast stays off on shared multi-GPU hosts (a program using it can take the host's
#: GPUs out of service): NCCL's NVLS, torch's symmetric-memory multicast, NVSHMEM's. These are
#: forced, not defaults a caller may override.
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
#: vLLM's symmetric-memory all-reduce runs ``multimem`` (multicast) at these TP sizes on Hopper
#: (vllm/distributed/device_communicators/symm_mem.py, ``_WORLD_SIZES_MULTIMEM["9.0"]``); there
#: it is turned off and the engine config records it. At TP2 it is two-shot and stays on.
MULTIMEM_TP = (4, 6, 8)
#: exit status of a job whose profile phase left passes to a fresh engine process
#: (``passes_per_engine``; EX_TEMPFAIL: "try again"), which `run_until_done` and
#: `profiles/device_vllm.sh` answer by starting the job again
MORE_PASSES = 75
#: the largest decode batch of the warm-up drain before any recorded phase (`main_async`)
WARMUP_DRAIN = 32
#: the token counts of vLLM's tuned fused-MoE configurations (the keys of its per-GPU config
#: files, `fused_moe/configs/E=...,N=...,device_name=....json`): a step of M tokens runs the
#: config of the nearest key, and Triton compiles each config at its first use, once per
#: specialization of M (divisible by 16, or not)
MOE_CONFIG_TOKENS = (
    1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096,
)  # fmt: skip


def warmup_prefill_sizes(limit: int) -> list[int]:
    """The prompt lengths the warm-up prefills one at a time, each alone in its step, so every
    fused-MoE configuration is compiled before a recorded phase (`MOE_CONFIG_TOKENS`, each key
    and the key + 1, below the engine's token ``limit``; and ``limit`` itself). Why: Qwen3-30B-
    A3B's replays stalled 0.8-1.7 s on steps of 1,001-1,353 prompt tokens and on the decode
    steps launched behind them, with vLLM logging "Triton kernel JIT compilation during
    inference: fused_moe_kernel", after a warm-up whose four prompts ran as one 5,120-token step
    (validation/vllm-0.24/README.md). Dense models only spend a few seconds on it."""
    sizes = {n for k in MOE_CONFIG_TOKENS for n in (k, k + 1) if n <= limit}
    return sorted(sizes | {limit})


def serve_env(tp: int, model_cfg: dict | None = None) -> dict[str, str]:
    """The environment a job's engine runs in (set before vLLM is imported). A block-wise FP8
    model (``weight_block_size`` in its quantization config) runs with ``VLLM_USE_DEEP_GEMM=0``
    unless the caller set it: vLLM 0.24 would JIT-compile DeepGEMM from headers the carried tree
    lacks and the engine dies at start-up (DeepSeek-V3's shard, 2026-11-26: an 80 s failed start
    when the variable was left to the caller)."""
    env = {k: os.environ.get(k, v) for k, v in SERVE_ENV.items()}
    quant = (model_cfg or {}).get("quantization_config") or {}
    if quant.get("weight_block_size"):
        env["VLLM_USE_DEEP_GEMM"] = "0"
    env.update((k, os.environ[k]) for k in RECORDED_ENV if k in os.environ)
    env.update(MULTICAST_OFF)
    if tp in MULTIMEM_TP:
        env["VLLM_ALLREDUCE_USE_SYMM_MEM"] = "0"
    return env


def start_engine(model_dir: str, tp: int, overrides: dict, load_format: str = "dummy"):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(
        model=model_dir,
        load_format=load_format,
        skip_tokenizer_init=True,
        tensor_parallel_size=tp,
        **overrides,
    )
    return AsyncLLM.from_engine_args(args, usage_context=UsageContext.OPENAI_API_SERVER)


def engine_facts(engine) -> dict:
    """Versions and the engine config as it took effect (read back, never assumed)."""
    import torch
    import vllm

    cfg = engine.vllm_config
    sc, cc, mc, comp, par = (
        cfg.scheduler_config, cfg.cache_config, cfg.model_config, cfg.compilation_config,
        cfg.parallel_config,
    )  # fmt: skip
    return {
        "vllm_version": vllm.__version__,
        "torch_version": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "gpu_count": torch.cuda.device_count(),
        "scheduler": _pick(
            sc,
            "max_num_batched_tokens max_num_seqs enable_chunked_prefill "
            "long_prefill_token_threshold max_num_partial_prefills policy "
            "async_scheduling scheduler_reserve_full_isl watermark",
        ),
        "cache": _pick(
            cc, "block_size gpu_memory_utilization num_gpu_blocks enable_prefix_caching cache_dtype"
        ),
        "model": _pick(mc, "max_model_len dtype quantization"),
        "compilation": _pick(
            comp, "mode cudagraph_mode cudagraph_capture_sizes max_cudagraph_capture_size"
        ),
        "parallel": _pick(
            par, "tensor_parallel_size data_parallel_size enable_expert_parallel all2all_backend"
        ),
    }


def _pick(obj, names: str) -> dict:
    out = {}
    for n in names.split():
        v = getattr(obj, n, None)
        out[n] = v if isinstance(v, (int, float, str, bool, type(None), list)) else str(v)
    return out


class Client:
    """Submits requests to the engine and keeps what a streaming client sees."""

    def __init__(self, engine, vocab: int, seed: int):
        self.engine, self.vocab, self.seed = engine, vocab, seed
        self.records: dict[str, dict] = {}

    async def request(self, rid: str, prompt_len: int, n_out: int, first: asyncio.Event = None):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        ids = vllm_grid.prompt_ids(self.seed, rid, prompt_len, self.vocab)
        sp = SamplingParams(max_tokens=n_out, min_tokens=n_out, ignore_eos=True, detokenize=False)
        rec = {"prompt": prompt_len, "out": n_out, "t_submit": time.monotonic(), "times": []}
        self.records[rid] = rec
        seen = 0
        async for o in self.engine.generate(TokensPrompt(prompt_token_ids=ids), sp, request_id=rid):
            n = len(o.outputs[0].token_ids)
            if n > seen:
                rec["times"].append([time.monotonic(), n - seen])
                seen = n
                if first is not None and not first.is_set():
                    first.set()
        rec["t_end"] = time.monotonic()


async def run_scenario(client: Client, sc: dict) -> dict:
    t0 = time.monotonic()
    sid = sc["id"]
    if sc["kind"] == "batch":
        outs = vllm_grid.outputs(sc)
        await asyncio.gather(
            *(
                client.request(f"{sid}/{i}", p, o)
                for i, (p, o) in enumerate(zip(sc["prompts"], outs, strict=True))
            )
        )
    else:
        await _inject(client, sc)
    rec = {"id": sid, "split": sc["split"], "t0": t0, "t1": time.monotonic()}
    if "repeat_of" in sc:
        rec["repeat_of"] = sc["repeat_of"]
    return rec


async def _inject(client: Client, sc: dict) -> None:
    """A decode batch runs while prompts are injected one at a time; then it is aborted."""
    sid, base = sc["id"], sc["prompts"]
    long_out = 4000
    firsts = [asyncio.Event() for _ in base]
    tasks = [
        asyncio.create_task(client.request(f"{sid}/{i}", p, long_out, firsts[i]))
        for i, p in enumerate(base)
    ]
    await asyncio.gather(*(e.wait() for e in firsts))
    await asyncio.sleep(0.05)
    if sc.get("rate_per_s"):
        await _arrive(client, sc)
    else:
        for j, p in enumerate(sc["inject"]):
            await client.request(f"{sid}/inj{j}", p, 2)
            await asyncio.sleep(0.03)
    for i in range(len(base)):
        await client.engine.abort(f"{sid}/{i}")
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _arrive(client: Client, sc: dict) -> None:
    """The injected prompts arrive at seeded exponential gaps (mean ``1 / rate_per_s``) without
    waiting for each other, as serving's do; named ``inj<j>`` like one-at-a-time injections, so
    the table builder treats them alike (not part of the scenario's submission burst)."""
    rng = random.Random(f"{client.seed}/{sc['id']}/arrivals")
    tasks = []
    for j, p in enumerate(sc["inject"]):
        req = client.request(f"{sc['id']}/inj{j}", p, sc.get("inject_out", 2))
        tasks.append(asyncio.create_task(req))
        await asyncio.sleep(rng.expovariate(sc["rate_per_s"]))
    await asyncio.gather(*tasks)


async def run_profile(client: Client, phase: dict, facts: dict, out: Path) -> dict:
    """Run the grid's scenarios; each finished one is appended to ``profile.partial.jsonl`` at
    once (its window and its requests), so a run cut short keeps what it finished and a job
    with ``"resume": true`` skips the scenarios a previous engine process finished.

    With ``passes_per_engine: N`` this process runs N passes (from the first unfinished one)
    and leaves the rest (``unfinished``) to a fresh engine. Why: the host time of launching a
    prompt step is a property of the engine process as much as of the machine. Two processes of
    one three-pass grid on one H100, minutes apart, launched DeepSeek-V2-Lite's eager prompt
    steps in a median 99 and 64 ms (graph ones 20 and 14 ms); on one H200 the int4 Llama-3-8B
    grid's process launched its eager steps in 27 ms and the serving replay's process after it
    in 15-17 ms (validation/vllm-0.24/README.md). A table whose launches all come from one
    process carries that process's draw; one pass per process samples the spread."""
    scs = vllm_grid.scenarios(**grid_args(phase, facts, out))
    scs = scs[: phase["limit"]] if phase.get("limit") else scs  # a smoke test's few
    grid = len(scs)
    scs = vllm_grid.repeated(scs, phase.get("repeats", 1))
    partial = out / f"{phase['name']}.partial.jsonl"
    done = {d["scenario"]["id"] for d in read_partial(partial)} if phase.get("resume") else set()
    if not phase.get("resume"):
        partial.unlink(missing_ok=True)
    todo = this_engines_share(
        [sc for sc in scs if sc["id"] not in done], phase.get("passes_per_engine")
    )
    for sc in todo:
        rec = await run_scenario(client, sc)
        reqs = {k: v for k, v in client.records.items() if k.startswith(sc["id"] + "/")}
        with open(partial, "a") as f:
            f.write(json.dumps({"scenario": rec, "requests": reqs}) + "\n")
        await asyncio.sleep(0.15)
        print(f"[{phase['name']}] {sc['id']}: {rec['t1'] - rec['t0']:.2f} s", flush=True)
    finished = read_partial(partial)
    client.records = {k: v for d in finished for k, v in d["requests"].items()}
    return {
        "scenarios": [d["scenario"] for d in finished],
        "grid_scenarios": grid,
        "repeats": phase.get("repeats", 1),
        "unfinished": len({sc["id"] for sc in scs} - {d["scenario"]["id"] for d in finished}),
    }


def grid_args(phase: dict, facts: dict, out: Path) -> dict:
    """The arguments of `vllm_grid.scenarios` for this phase: from this engine's facts, kept in
    ``<phase>.grid.json``; a resumed phase takes the kept ones. Why: the grid depends on the
    engine's KV capacity, which differs between engine starts on one machine (an H100 Llama-3-8B
    profile: 28,957 blocks in the first engine, which compiled, 29,074 in the four after it,
    which loaded the compile cache), and a grid drawn again by a later engine renamed a
    capacity-sized scenario (``drain_b284_c1024`` -> ``drain_b285_c1024``), so that the later
    engine re-ran it as unfinished. Scenarios use at most 80% of the capacity, so a later
    engine's slightly different capacity still fits the kept grid."""
    kept = out / f"{phase['name']}.grid.json"
    mine = {
        "max_model_len": facts["model"]["max_model_len"],
        "kv_tokens": facts["cache"]["num_gpu_blocks"] * facts["cache"]["block_size"],
        "seed": phase.get("seed", 0),
        "max_tokens": phase.get("max_scenario_tokens", vllm_grid.MAX_SCENARIO_TOKENS),
        "max_num_seqs": facts["scheduler"]["max_num_seqs"],
        "max_graph": facts["compilation"]["max_cudagraph_capture_size"],
        "token_budget": facts["scheduler"]["max_num_batched_tokens"],
    }
    if phase.get("resume") and kept.is_file():
        args = json.loads(kept.read_text())
        if args != mine:
            print(f"[{phase['name']}] the grid of the first engine ({kept.name}): {args}, "
                  f"this engine's would be {mine}", flush=True)  # fmt: skip
        return args
    kept.write_text(json.dumps(mine))
    return mine


def this_engines_share(todo: list[dict], passes: int | None) -> list[dict]:
    """The scenarios of ``todo`` (unfinished, in grid order) that this engine process runs:
    all, or with ``passes`` those of the first ``passes`` passes from the first unfinished one
    (pass ``r`` is the ``~r<r>`` suffix `vllm_grid.repeated` gives; the base grid is pass 0)."""
    if not passes or not todo:
        return todo
    first = vllm_grid.pass_index(todo[0]["id"])
    return [sc for sc in todo if vllm_grid.pass_index(sc["id"]) < first + passes]


def read_partial(path: Path) -> list[dict]:
    """The scenarios a profile phase finished so far (a line cut by a kill is dropped)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


async def run_replay(client: Client, phase: dict) -> dict:
    data = json.loads(Path(phase["arrivals"]).read_text())
    t0 = time.monotonic()
    tasks = []
    for i, (t, p, o) in enumerate(data["requests"]):
        delay = t0 + t - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        # ids (hence prompt tokens) unique per phase: a later phase must not hit the prefix
        # cache of an earlier one (seen: arXiv TTFT p50 18 ms with ids shared across phases)
        rid = f"{phase['name']}/r{i}"
        tasks.append(asyncio.create_task(client.request(rid, int(p), int(o))))
    await asyncio.gather(*tasks)
    return {"t_origin": t0, "fingerprint": data.get("fingerprint")}


async def main_async(job: dict, out: Path) -> int:
    """Run ``job`` into ``out`` on one engine; the one entry of a job, in its own process
    (``python -m profiles.vllm_run``, which `run_until_done` starts): the serving environment,
    NVLink multicast off included, is set here, before vLLM is imported. Returns 0, or
    `MORE_PASSES` when a profile phase left passes to a fresh engine (later phases not run)."""
    check_passes_per_engine(job)
    model_cfg = json.loads((Path(job["model_dir"]) / "config.json").read_text())
    env = serve_env(job.get("tp", 1), model_cfg)
    os.environ.update(env)
    vllm_steps.install(str(out / "steps.jsonl"))
    prec = job_precision(job)
    cfg_adds, args = engine_precision(prec["weights"], prec["kv_cache_dtype"])
    if _quant_method(cfg_adds) != _quant_method(model_cfg):  # block-wise FP8 is still fp8
        raise SystemExit(f"{job['model_dir']}/config.json was not written for {prec['weights']}")
    load_format = _load_format(job, model_cfg, out / "routing_at_load")
    engine = start_engine(
        job["model_dir"], job.get("tp", 1), {**args, **job.get("engine", {})}, load_format
    )
    facts = _record_facts(engine, job, prec, env, out)
    vocab = model_cfg["vocab_size"]
    await warm_up(engine, vocab, facts)
    energy = gpu_energy.EnergySampler(out / f"energy.{os.getpid()}.jsonl").start()
    t_idle = time.monotonic()
    await asyncio.sleep(2.0)  # an idle window: the engine's power with nothing to run
    energy.mark("idle_window", t_idle, time.monotonic())
    try:
        for phase in job["phases"]:
            info = await _run_phase(engine, vocab, phase, facts, out)
            if info.get("unfinished") and phase.get("passes_per_engine"):
                left = info["unfinished"]
                print(f"phase {phase['name']}: {left} scenarios left to a fresh engine")
                return MORE_PASSES
    finally:
        energy.stop()
        engine.shutdown()
    return 0


def _record_facts(engine, job: dict, prec: dict, env: dict, out: Path) -> dict:
    """The engine's effective config and what the job asked for, written to ``engine.json``
    (each engine of a resumed or multi-engine run rewrites it: the last start's)."""
    facts = engine_facts(engine)
    facts["job"], facts["precision"] = job, prec
    facts["routing"] = job.get("routing", "dummy")
    if job.get("routing_skew"):
        facts["routing_skew"] = float(job["routing_skew"])
    seen = sorted(out.glob("routing_at_load.*.json"))  # one per engine process (TP rank)
    if seen:
        facts["routing_at_load"] = json.loads(seen[0].read_text())
    facts["env"] = env
    # when this engine started: a table's meta.yaml says when it was recorded (`created_utc` is
    # when the table was built, which a rebuild moves); a resumed run's last start
    facts["engine_started_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (out / "engine.json").write_text(json.dumps(facts, indent=1))
    print(json.dumps(facts), flush=True)
    return facts


async def _run_phase(engine, vocab: int, phase: dict, facts: dict, out: Path) -> dict:
    """Run one phase and write ``<name>.json.gz`` (its requests, window and what it ran)."""
    client = Client(engine, vocab, phase.get("seed", 0))
    t0 = time.monotonic()
    if phase["kind"] == "profile":
        info = await run_profile(client, phase, facts, out)
    else:
        info = await run_replay(client, phase)
    info.update(name=phase["name"], t0=t0, t1=time.monotonic(), requests=client.records)
    # written aside, then renamed: a job timeout during the write (seen twice, on
    # three-pass runs of 27k requests) leaves no truncated file for RESUME to trip on
    dest = out / f"{phase['name']}.json.gz"
    with gzip.open(dest.with_suffix(".tmp"), "wt") as f:
        json.dump(info, f)
    os.replace(dest.with_suffix(".tmp"), dest)
    print(f"phase {phase['name']}: {info['t1'] - t0:.1f} s, {len(client.records)} requests",
          flush=True)  # fmt: skip
    await asyncio.sleep(1.0)  # let the step log flush
    return info


def check_passes_per_engine(job: dict) -> None:
    """A phase that leaves passes to the next engine must resume in it: without ``resume`` the
    next process would drop what this one recorded and start over, forever."""
    for phase in job["phases"]:
        n = phase.get("passes_per_engine")
        if n is None:
            continue
        if phase.get("kind") != "profile" or not isinstance(n, int) or n < 1:
            raise SystemExit(f"phase {phase.get('name')}: passes_per_engine is for a profile "
                             f"phase and must be an integer >= 1, got {n!r}")  # fmt: skip
        if not phase.get("resume"):
            raise SystemExit(f"phase {phase.get('name')}: passes_per_engine needs resume: true")


def run_until_done(job_path: Path, out: Path, max_engines: int = 16) -> int:
    """Run the job in a fresh ``python -m profiles.vllm_run`` process (so a fresh engine core)
    until no phase leaves passes (`MORE_PASSES`); the exit status of the last process. Why a
    process each and not a new engine in one process: that is the path the lent machines run
    (`profiles/device_vllm.sh` loops the same way), and nothing of one engine outlives it."""
    cmd = [sys.executable, "-m", "profiles.vllm_run", str(job_path), "--out", str(out)]
    for _ in range(max_engines):
        rc = subprocess.run(cmd, check=False).returncode
        if rc != MORE_PASSES:
            return rc
    raise SystemExit(f"{job_path}: still unfinished after {max_engines} engine processes")


async def warm_up(engine, vocab: int, facts: dict) -> None:
    """Run, unrecorded, what a recorded phase would otherwise pay for first (comments below)."""
    # the engine's first requests pay one-time warm-up (seen: a 415 ms first step), which no
    # recorded phase should carry. Decode batches pay theirs at first use too: Qwen3-30B-A3B's
    # first replay phase had 0.8 s and 1.4 s steps at decode batches 3 and 6 in both recorded
    # replays (validation/vllm-0.24/README.md), after the prefill warm-up, so a drain through
    # every decode batch from WARMUP_DRAIN down to 1 follows it (first run in DeepSeek-V2-Lite's
    # replay of 2026-11-26: no step above 300 ms after the warm-up). A Qwen3 replay with the
    # drain still stalled, on the first steps of new fused-MoE configurations: one prompt of
    # each configuration's size runs alone first (`warmup_prefill_sizes`; on GPUs since
    # 2026-11-26 evening)
    warm = Client(engine, vocab, seed=-1)
    await asyncio.gather(*(warm.request(f"warmup/{i}", 512 * (i + 1), 8) for i in range(4)))
    limit = min(facts["scheduler"]["max_num_batched_tokens"], facts["model"]["max_model_len"] - 1)
    for n in warmup_prefill_sizes(limit):
        await warm.request(f"warmup/p{n}", n, 1)  # one prompt alone: a step of n tokens
    await asyncio.gather(*(warm.request(f"warmup/d{i}", 16, 2 + i) for i in range(WARMUP_DRAIN)))


def _load_format(job: dict, model_cfg: dict, report: Path) -> str:
    """vLLM's dummy load, or with ``"routing": "token_dependent"`` the dummy load with its MoE
    routers re-drawn (`profiles.dummy_routing`; registered here, before the engine forks),
    skewed by the job's ``routing_skew`` (a Zipf exponent; absent or 0: uniform). What the
    routers do right after the load is written under ``report`` (`routing_at_load`)."""
    routing = job.get("routing", "dummy")
    skew = job.get("routing_skew", 0.0)
    if routing == "dummy":
        if skew:
            raise SystemExit("job routing_skew needs routing: token_dependent")
        return "dummy"
    if routing != "token_dependent":
        raise SystemExit(f"job routing: expected dummy or token_dependent, got {routing!r}")
    if not isinstance(skew, (int, float)) or not 0 <= skew < 16:
        raise SystemExit(f"job routing_skew: expected a Zipf exponent in [0, 16), got {skew!r}")
    from profiles import dummy_routing

    try:  # a router that cannot be skewed is refused before vLLM is imported (`register`)
        return dummy_routing.register(model_cfg, skew=float(skew), report=str(report))
    except ValueError as e:
        raise SystemExit(f"{job['model_dir']}/config.json: {e}") from None


def _quant_method(cfg: dict) -> str | None:
    return (cfg.get("quantization_config") or {}).get("quant_method")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("job", help="job JSON: model_dir, tp, engine overrides, phases")
    ap.add_argument("--out", required=True, help="folder for engine.json, steps, phases")
    a = ap.parse_args(argv)
    job = json.loads(Path(a.job).read_text())
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    return asyncio.run(main_async(job, out))


if __name__ == "__main__":
    sys.exit(main())
