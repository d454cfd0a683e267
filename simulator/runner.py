"""``simulate(config)``: build a run from a config mapping, run it, return its results.

Building reads every section strictly and resolves it (catalog names to full specs, defaults
filled in, KV capacity computed), so a bad config fails before any simulated time passes, and
the resolved config can be written beside the results. Running is pure: same config + seed gives
identical results. Writing files is `simulator.results`' job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import simpy

from policies.routing import ROUTERS
from simulator import latency as _latency  # noqa: F401  (package init)
from simulator.cfg import Section
from simulator.cluster import ArrivalTie, Cluster
from simulator.config import TOP_LEVEL, folder_name_problem
from simulator.energy import DEFAULT_USD_PER_KWH, energy_model
from simulator.engine import MAX_REPLICAS, EngineSpec, mark_all_used
from simulator.errors import ConfigError
from simulator.executor import SimulatedExecutor
from simulator.hardware import GPUSpec, check_precision, load_gpu
from simulator.latency.select import build_latency
from simulator.metrics import step_arrays, summarize
from simulator.models import ModelSpec, load_model
from simulator.replica import Replica
from simulator.served import EP_MODES, ShardedModel, check_expert_parallel
from simulator.steplog import chunk_rows, share_packing
from workloads.build import build_workload
from workloads.spec import RequestColumns, Workload


@dataclass
class Built:
    """Everything a run needs, resolved from one config."""

    name: str
    seed: int
    model: ModelSpec
    gpu: GPUSpec
    tp: int
    workload: Workload
    latency: object
    slo: dict
    price_per_gpu_hour: float
    horizon_s: float | None
    coalesce: bool
    #: callable(env, cluster, executor_factory=None) -> list[Replica]; ``executor_factory(latency,
    #: replica_index) -> StepExecutor`` replaces SimulatedExecutor (profiles/real_executor.py)
    make_replicas: object
    router: object
    resolved: dict = field(default_factory=dict)
    #: the SeedSequence the policies' generators are spawned from (one child per replica)
    policy_seed: object = None
    #: electricity price ($/kWh) and the steps' energy model (`simulator.energy.energy_model`)
    usd_per_kwh: float = DEFAULT_USD_PER_KWH
    energy: object = None


@dataclass
class Results:
    summary: dict
    requests: dict  # column arrays (see metrics.request_table)
    steps: dict  # column arrays (see metrics.step_arrays)
    resolved: dict
    wall_s: float


def read_expert_parallel(hw: Section, model, tp: int) -> str | None:
    """``hardware.expert_parallel``: false (default; experts split over TP), true (vLLM's
    ``--enable-expert-parallel`` at DP 1: `EP_MODES` ``allreduce``) or ``all_to_all``; a
    ConfigError naming the key for a dense model, tp 1 or experts that do not split evenly.
    KV capacity needs no change: with ``ep == tp`` each GPU holds the TP share of the weights
    (`ShardedModel.weight_bytes_per_gpu`) and attention, hence KV, stays TP-sharded."""
    value = hw.raw("expert_parallel", False)
    if value is False:
        return None
    mode = "allreduce" if value is True else value
    if mode not in EP_MODES:
        raise hw.error("expert_parallel", f"expected false, true or one of {list(EP_MODES)}, "
                       f"got {value!r}")  # fmt: skip
    check_expert_parallel(model, tp, mode, hw.where, hw.key("expert_parallel"))
    if mode == "all_to_all" and model.moe.routing_skew:
        raise hw.error("expert_parallel", "model.routing_skew with all_to_all is not modelled "
                       "(the busiest GPU's dispatch and combine traffic under skew); "
                       "expert_parallel: true (all-reduce) is")  # fmt: skip
    return mode


@dataclass(frozen=True)
class _Hardware:
    """The ``hardware`` section as read (GPU, TP, expert parallelism, prices)."""

    gpu: GPUSpec
    tp: int
    expert_parallel: str | None
    price: float
    usd_per_kwh: float


def _read_hardware(top: Section, model, where: str) -> _Hardware:
    hw = top.section("hardware")
    gpu = load_gpu(hw.raw("gpu"), where, hw.key("gpu"))
    check_precision(model, gpu, where, "model.weights")
    tp = hw.int("tp", 1, min=1)
    model.check_tp(tp, where, hw.key("tp"))
    expert_parallel = read_expert_parallel(hw, model, tp)
    price = hw.num("price_per_gpu_hour", gpu.price_per_hour, min=0)
    usd_per_kwh = hw.num("usd_per_kwh", DEFAULT_USD_PER_KWH, min=0)
    if not math.isfinite(usd_per_kwh):
        raise hw.error("usd_per_kwh", f"expected a finite number >= 0, got {usd_per_kwh}")
    hw.done()
    return _Hardware(gpu, tp, expert_parallel, price, usd_per_kwh)


@dataclass(frozen=True)
class _Cluster:
    """The ``cluster`` section as read, and the KV geometry every request must fit."""

    mode: str
    router_name: str
    router: object
    disagg: object
    num_replicas: int
    num_blocks: int
    block_size: int


def _read_cluster(top, kvs, main, model, hwr: _Hardware, where: str) -> _Cluster:
    cl = top.section("cluster", {})
    mode = cl.str("mode", "colocated", choices=["colocated", "disaggregated"])
    rsec = cl.section("router", {"name": "round_robin"})
    router_name = rsec.str("name", "round_robin", choices=sorted(ROUTERS))
    rview = Section(rsec.data, where, rsec.path)
    rview.raw("name")
    router = ROUTERS[router_name](rview)
    rview.done()
    mark_all_used(rsec)
    if mode == "disaggregated":
        from simulator.disagg import DisaggSpec

        if cl.has("replicas"):
            raise cl.error("replicas", "disaggregated mode counts replicas per pool")
        disagg = DisaggSpec.parse(cl, top.data.get("scheduler"), kvs, model, hwr.gpu, hwr.tp, where)
        # requests must fit the smaller of the two pools' caches
        out = _Cluster(
            mode, router_name, router, disagg, disagg.prefill_replicas + disagg.decode_replicas,
            min(disagg.prefill.num_blocks, disagg.decode.num_blocks), disagg.prefill.block_size,
        )  # fmt: skip
    else:
        replicas = cl.int("replicas", 1, min=1, max=MAX_REPLICAS)
        out = _Cluster(mode, router_name, router, None, replicas, main.num_blocks,
                       main.block_size)  # fmt: skip
    cl.done()
    return out


def _read_slo(top: Section) -> dict:
    slo_sec = top.section("slo", {})
    slo = {
        "ttft_s": _ms(slo_sec.num("ttft_ms", None, min=0, strict_min=True)),
        "tpot_s": _ms(slo_sec.num("tpot_ms", None, min=0, strict_min=True)),
    }
    slo_sec.done()
    return slo


def build(config: dict, where: str, base_dir: Path, seed: int | None = None) -> Built:
    """Read and check a whole experiment config (every error names the file and key) and
    return what `simulate` needs. Reads sections in a fixed order, so the first error a user
    sees is the same whatever else is wrong."""
    top = Section(config, where)
    for key in config:
        if key not in TOP_LEVEL:
            raise top.error(str(key), f"unknown section (known: {', '.join(TOP_LEVEL)})")
    name = top.str("name", Path(where).stem)
    if folder_name_problem(name):
        raise top.error("name", folder_name_problem(name))
    top.str("description", "")
    seed = top.int("seed", 0, min=0) if seed is None else seed
    ss = np.random.SeedSequence(seed)
    wl_seed, policy_seed = ss.spawn(2)

    model = load_model(top.raw("model"), where, "model")
    hwr = _read_hardware(top, model, where)
    gpu, tp = hwr.gpu, hwr.tp

    sim = top.section("sim", {})
    horizon_s = sim.num("horizon_s", None, min=0, strict_min=True)
    coalesce = sim.bool("coalesce", True)
    sim.done()

    sched = top.section("scheduler")
    kvs = top.section("kv_cache", {})
    on_oversize = kvs.str("on_oversize", "error", choices=["error", "reject"])
    main = EngineSpec.parse(sched, kvs, model, gpu, tp, where)
    cluster = _read_cluster(top, kvs, main, model, hwr, where)
    kvs.done()

    # a table measured through a serving engine times that engine's scheduling (policy)
    serving_engine = "vllm" if cluster.disagg is None and main.policy_cls.name == "vllm" else None
    latency = build_latency(
        top.section("latency", {}), model, gpu, tp, where, base_dir, serving_engine,
        expert_parallel=hwr.expert_parallel,
    )  # fmt: skip

    workload = build_workload(
        top.section("workload"), np.random.default_rng(wl_seed), Path(base_dir)
    )
    rows = cluster.num_blocks // ShardedModel(model, tp).kv_pool(cluster.block_size).blocks_per_row
    _check_fits(workload, model.max_model_len, rows * cluster.block_size, on_oversize, where)

    slo = _read_slo(top)
    top.section("output", {}).done()

    make_replicas = _replica_factory(main, cluster, latency, coalesce, policy_seed, where)
    resolved = _resolved(config, name, seed, model, hwr, main, cluster, latency, on_oversize)
    resolved["slo"] = {"ttft_ms": _to_ms(slo["ttft_s"]), "tpot_ms": _to_ms(slo["tpot_s"])}
    resolved["sim"] = {"horizon_s": horizon_s, "coalesce": coalesce}
    return Built(
        name, seed, model, gpu, tp, workload, latency, slo, hwr.price, horizon_s, coalesce,
        make_replicas, cluster.router, resolved, policy_seed, hwr.usd_per_kwh,
        energy_model(latency, gpu, tp),
    )  # fmt: skip


def _resolved(config, name, seed, model, hwr: _Hardware, main, cluster: _Cluster, latency,
              on_oversize) -> dict:  # fmt: skip
    """The experiment as run (resolved.yaml, a real run's fingerprint): every default filled."""
    return {
        "name": name,
        "seed": seed,
        "model": model.resolved(),
        "hardware": {
            "gpu": gpu_record(hwr.gpu),
            "tp": hwr.tp,
            "price_per_gpu_hour": hwr.price,
            **({"expert_parallel": hwr.expert_parallel} if hwr.expert_parallel else {}),
        },  # fmt: skip
        "scheduler": main.resolved_scheduler,
        "kv_cache": {
            **main.resolved_kv,
            "kv_bytes_per_token": ShardedModel(model).kv_bytes_per_token_per_gpu,
            "on_oversize": on_oversize,
        },
        "latency": latency.describe(),
        "cluster": {
            "mode": cluster.mode,
            "replicas": cluster.num_replicas,
            "router": {"name": cluster.router_name, **cluster.router.params()},
            **(cluster.disagg.resolved() if cluster.disagg is not None else {}),
        },
        "workload": config.get("workload"),
    }


def _replica_factory(main, cluster: _Cluster, latency, coalesce, policy_seed, where):
    """``make_replicas(env, cluster, executor_factory=None) -> list[Replica]`` of a build."""

    def make_replicas(env, sim_cluster, executor_factory=None):
        # a fresh copy of the policy stream each run, so a Built simulates identically twice
        policy_streams = np.random.SeedSequence(
            policy_seed.entropy, spawn_key=policy_seed.spawn_key
        )
        if cluster.disagg is not None:
            if executor_factory is not None:
                raise ConfigError(where, "cluster.mode", "executor_factory needs mode colocated")
            return cluster.disagg.make_replicas(env, sim_cluster, latency, coalesce, policy_streams)
        reps, chunk = [], chunk_rows(cluster.num_replicas)
        for i in range(cluster.num_replicas):
            rng = np.random.default_rng(policy_streams.spawn(1)[0])
            executor = (
                SimulatedExecutor(latency) if executor_factory is None
                else executor_factory(latency, i)
            )  # fmt: skip
            kv = main.make_kv(block_ids=getattr(executor, "reads_block_ids", False))
            rep = Replica(
                env, i, main.make_policy(rng), kv, executor, coalesce=coalesce, step_chunk=chunk
            )
            sim_cluster.add_replica(rep)
            reps.append(rep)
        share_packing([rep.steps for rep in reps])
        return reps

    return make_replicas


#: young-generation threshold while the event loop runs (Python's default: 700 allocations)
GC_GEN0_THRESHOLD = 50_000


@contextlib.contextmanager
def fewer_collections():
    """Collect the young generation every `GC_GEN0_THRESHOLD` allocations instead of 700 while
    the event loop runs, then restore the interpreter's thresholds.

    Why: the loop allocates millions of short-lived objects (events, plans, tuples) that die
    young without cycles; the default threshold runs the cyclic collector tens of thousands of
    times for nothing. Results do not depend on it (collection frees unreachable cycles only)."""
    before = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, before[1], before[2])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def simulate(built: Built, executor_factory=None, progress=None, hand_over=True) -> Results:
    """Run one built experiment to completion (or to its horizon).

    ``executor_factory(latency, replica_index) -> StepExecutor`` (default: SimulatedExecutor of
    the built latency model) lets the same run execute its steps elsewhere, e.g. on a real GPU
    (profiles/real_executor.py); policies, arrivals and metrics are unchanged.
    ``progress(now_s, done)`` is called every few dozen events with the clock and the number of
    requests finished or rejected so far (a terminal's progress line); it only reads, so results
    are the same with or without it.
    ``hand_over=False``: one SimPy event per arrival even where replicas could take their own
    (`Cluster.can_hand_over`); the results are the same either way (tests compare them).
    """
    t0 = time.perf_counter()
    env, cluster, replicas = _run_events(built, executor_factory, progress, hand_over)
    frontend = getattr(built.latency, "frontend", None)
    if built.horizon_s is not None:
        end_s = built.horizon_s
        for rep in replicas:
            rep.sync()
    else:
        end_s = env.now
    cols = cluster.log.table(frontend.output_s if frontend else 0.0)
    steps = step_arrays(replicas, release=True)
    summary = summarize(
        cols, steps, replicas, slo=built.slo, model=built.model, gpu=built.gpu, tp=built.tp,
        end_s=end_s, price_per_gpu_hour=built.price_per_gpu_hour, energy=built.energy,
        usd_per_kwh=built.usd_per_kwh,
    )  # fmt: skip
    summary["requests"]["not_arrived_by_horizon"] = (
        len(built.workload.requests) - cluster.num_arrived
    )
    summary["requests"]["cut_by_workload_limits"] = dict(built.workload.cuts)
    summary["workload"] = built.workload.info
    summary["seed"] = seed_record(built, replicas)
    summary["latency_model"] = built.latency.describe()
    summary["kv_cache"] = {
        "allocator": getattr(replicas[0].kv, "kind", "paged"),
        "num_blocks_per_replica": replicas[0].kv.num_blocks,
        "block_size": replicas[0].kv.block_size,
        "capacity_tokens_per_replica": replicas[0].kv.num_blocks * replicas[0].kv.block_size,
    }
    summary.update(policy_summary(replicas))
    if getattr(cluster, "describe", None) is not None:
        summary["disaggregation"] = cluster.describe()
    _check_conservation(cluster, replicas, horizon=built.horizon_s is not None)
    return Results(summary, cols, steps, built.resolved, time.perf_counter() - t0)


def _run_events(built: Built, executor_factory, progress, hand_over: bool):
    """The run's environment, cluster and replicas after the event loop.

    Where `Cluster.can_hand_over` (and the executor is the simulated one: a run may start
    over), the replicas take their own arrivals, one SimPy event a request fewer; if the run
    meets an exact tie between a replica's event and one of its arrivals (`ArrivalTie`),
    whose order only one event per arrival reproduces, it starts over that way (a progress
    callback then sees the clock go back)."""
    frontend = getattr(built.latency, "frontend", None)
    while True:
        env = simpy.Environment()
        cluster = Cluster(
            env, built.workload.requests, built.router, keep_requests=False,
            input_delay=frontend.input_s if frontend else None,
        )  # fmt: skip
        replicas = built.make_replicas(env, cluster, executor_factory)
        hand_over = hand_over and executor_factory is None and cluster.can_hand_over()
        cluster.start(hand_over, built.horizon_s)
        try:
            _run_loop(env, replicas, built.horizon_s, progress)
            if hand_over and built.horizon_s is not None:
                cluster.take_late_arrivals(built.horizon_s)
        except ArrivalTie:
            hand_over = False
            continue
        return env, cluster, replicas


def _run_loop(env: simpy.Environment, replicas: list, until: float | None, progress) -> None:
    """SimPy's event loop to ``until`` (None: to the end), reporting progress if asked: the
    clock and how many requests the replicas have finished or rejected so far."""
    with fewer_collections():
        if progress is None:
            env.run(until=until)
        else:
            _run_reporting(
                env, until,
                lambda: progress(env.now, sum(r.num_finished + r.num_rejected for r in replicas)),
            )  # fmt: skip


def gpu_record(gpu: GPUSpec) -> dict:
    """The GPU as the resolved config records it: every field but ``tdp_w``, which only feeds
    the energy estimate and is recorded in summary.json's ``energy`` section. Why: the resolved
    ``hardware`` section is part of a saved real run's fingerprint (`servesim validate`), and
    runs saved before GPUs had a TDP must still match their experiment."""
    rec = dataclasses.asdict(gpu)
    rec.pop("tdp_w")
    return rec


def _run_reporting(env: simpy.Environment, until: float | None, report, every: int = 64):
    """``env.run(until)`` step by step, calling ``report()`` every ``every`` events.

    Why not ``env.run`` in slices: a slice boundary adds an event and moves ``env.now`` to it
    even when the queue empties first. This loop is ``simpy.Environment.run`` itself (the same
    stop event, scheduled at the same point), so the run is event for event the same.
    """
    if until is not None:
        stop = simpy.Event(env)
        stop._ok, stop._value = True, None
        env.schedule(stop, simpy.core.URGENT, until - env.now)
        stop.callbacks.append(simpy.core.StopSimulation.callback)
    count = 0
    try:
        while True:
            env.step()
            count += 1
            if count % every == 0:
                report()
    except (simpy.core.StopSimulation, simpy.core.EmptySchedule):
        pass
    report()


def seed_record(built: Built, replicas) -> dict:
    """The seed, and which random streams were drawn from: a trace replayed as recorded by a
    policy that draws nothing gives the same results for every seed, and says so."""
    draws = list(built.workload.random_draws)
    if built.policy_seed is not None:
        streams = np.random.SeedSequence(
            built.policy_seed.entropy, spawn_key=built.policy_seed.spawn_key
        )
        for rep in replicas:  # replica i got the i-th child stream (colocated and P/D alike)
            fresh = np.random.default_rng(streams.spawn(1)[0]).bit_generator.state
            rng = (getattr(rep.policy, "engine", None) or {}).get("rng")
            if rng is not None and rng.bit_generator.state != fresh:
                draws.append(f"policy (replica {rep.index})")
    return {
        "value": built.seed,
        "random_draws": draws,
        "matters": bool(draws),
    }


def _check_conservation(cluster, replicas, horizon: bool) -> None:
    """Every arrived request is accounted for; after a full run every KV block is back."""
    if not horizon:
        for rep in replicas:
            if rep.waiting or rep.running or rep.kv.num_used_blocks:
                raise AssertionError(
                    f"replica {rep.index} ended with {len(rep.waiting)} waiting, "
                    f"{len(rep.running)} running, {rep.kv.num_used_blocks} KV blocks held"
                )


def _check_fits(workload, max_model_len, capacity_tokens, on_oversize, where) -> None:
    if on_oversize != "error":
        return
    limit = min(max_model_len, capacity_tokens)
    cols = RequestColumns.of(workload.requests)
    over = np.flatnonzero(cols.num_prompt_tokens + cols.num_output_tokens > limit)
    if over.size:
        i = int(over[0])
        prompt, output = int(cols.num_prompt_tokens[i]), int(cols.num_output_tokens[i])
        total = prompt + output
        what = (
            f"max_model_len {max_model_len}"
            if total > max_model_len
            else f"the KV cache ({capacity_tokens} tokens per replica)"
        )
        raise ConfigError(
            where,
            "workload",
            f"request {i} needs {total} tokens (prompt {prompt} + output "
            f"{output}), more than {what}; set workload.limits.max_total_tokens "
            "to cut such requests, or kv_cache.on_oversize: reject",
        )


def policy_summary(replicas) -> dict:
    """Preemption, prefix-cache and speculative counters summed over replicas."""
    out: dict = {}
    pre = [r.policy.preemption for r in replicas if getattr(r.policy, "preemption", None)]
    if pre:
        stats = {k: sum(p.stats[k] for p in pre) for k in pre[0].stats}
        out["preemption"] = {"mode": pre[0].mode, **stats}
    kvs = [r.kv for r in replicas if hasattr(r.kv, "hit_tokens")]
    if kvs:
        q = sum(k.query_tokens for k in kvs)
        h = sum(k.hit_tokens for k in kvs)
        out["prefix_cache"] = {
            "query_tokens": q,
            "hit_tokens": h,
            "hit_rate": h / q if q else 0.0,
            "evictions": sum(k.evictions for k in kvs),
        }
    spec = [r.policy.stats for r in replicas if r.policy.name == "speculative"]
    if spec:
        tot = {k: sum(s[k] for s in spec) for k in spec[0]}
        tot["tokens_per_verify"] = (
            tot["emitted_tokens"] / tot["verified_seqs"] if tot["verified_seqs"] else None
        )
        out["speculative"] = tot
    return out


def _ms(v):
    return None if v is None else v / 1000.0


def _to_ms(v):
    return None if v is None else v * 1000.0
