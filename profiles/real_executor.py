"""A `StepExecutor` that runs each simulator step on a real GPU and returns the measured time.

Why: the same policy code then drives a real forward, so the gap between simulation (latency
table) and reality can be measured on whole serving runs, not only on isolated steps. The
replica's clock advances by the measured time, so arrivals, queueing, batching and preemption
unfold exactly as they would with real step times (``can_precompute = False``: no decode runs are
computed ahead).

Per step: the plan is translated (`profiles.step_batch.plan_to_batch`: prefill chunks with their
cached context, the whole decode set, single-token chunks as decodes, the simulator's block
tables) and run by `profiles.torch_model.StepRunner` (random-weight model of the experiment's
shape; decode-only steps as CUDA graphs; mixed steps as piecewise CUDA graphs with eager
attention up to 512 tokens and eagerly above, as vLLM v1 runs them, by default: ``mixed_mode``
must match how the table being validated timed its whole steps, its meta.yaml's
``step_runner.mixed_mode``). The piecewise graphs are captured once, when the runner is built.

What the returned time includes (``time_mode="wall"``, the default): host wall-clock from the
start of the translation to the end of the step's GPU work: building the step's metadata lists,
copying them to the GPU, launching (or replaying) the forward, sampling, and the final
synchronize. That is the step time of a synchronous engine without CPU/GPU overlap. Not
included: the policy's own scheduling work (simulator code), detokenization, API serving, and a
CUDA graph's one-time capture (a step that triggers a capture is run again and the second run is
timed), nor Python garbage collection (paused during a step, ``pause_gc``): the collector's
pauses scale with the *simulator's* heap (workload, request records), not an engine's, and an
eager step allocates enough Python objects to trigger them. ``time_mode="gpu"`` returns only
the CUDA-event time StepRunner reports (what the profiled tables modelled before session 4;
since then they are fitted to the profiled steps' host wall-clock, as ``wall`` here measures).

KV cache: StepRunner is built with ``num_blocks`` = the experiment's ``kv_cache.num_blocks`` so
the simulated allocator's block ids index the real cache. With torch 2.11, ``varlen_attn`` has no
``block_table`` argument and StepRunner falls back to its contiguous layout (each step's
sequences packed back to back); the attention then reads the same number of KV bytes, but the
block ids are not used on the GPU (``kv_layout`` in `describe()` says which layout ran). The
translation itself is checked on CPU against a paged reference (tests/test_real_executor.py).

Per step it records (features, predicted seconds from the latency model, GPU seconds, wall
seconds) in ``records``, for the validation report. Importing this module does not import torch.
"""

from __future__ import annotations

import gc
import math
import time

from profiles.step_batch import plan_to_batch

RECORD_FIELDS = (
    "prefill_tokens", "prefill_attn", "prefill_seqs", "decode_seqs", "decode_ctx",
    "max_decode_ctx", "predicted_s", "gpu_s", "wall_s",
)  # fmt: skip


class RealGPUExecutor:
    can_precompute = False
    #: the paged layout indexes the cache with the simulator's block ids (`plan_to_batch`), so
    #: a run gives this executor an allocator that keeps them (`engine.EngineSpec.make_kv`)
    reads_block_ids = True

    def __init__(
        self,
        model_spec,
        tp: int,
        kv_num_blocks: int,
        block_size: int,
        *,
        latency=None,
        runner=None,
        time_mode: str = "wall",
        max_tokens: int = 65536,
        max_seqs: int = 512,
        pause_gc: bool = True,
        mixed_mode: str = "piecewise",
    ):
        """``runner``: an existing StepRunner to reuse (weights, cache and captured graphs are
        expensive; one runner serves many runs if its cache is at least ``kv_num_blocks``).
        ``latency``: the model whose prediction is recorded beside each measurement."""
        if time_mode not in ("wall", "gpu"):
            raise ValueError("time_mode must be 'wall' or 'gpu'")
        if runner is None:
            from profiles.torch_model import StepRunner

            # headroom beyond the experiment's blocks: StepRunner pads CUDA-graph batches with
            # one-token dummy sequences, which need cache slots of their own
            runner = StepRunner(
                model_spec, tp=tp, num_blocks=kv_num_blocks + max_seqs // block_size + 1,
                block_size=block_size,
                max_tokens=max_tokens, max_seqs=max_seqs,
                max_model_len=getattr(model_spec, "max_model_len", None), mixed_mode=mixed_mode,
            )  # fmt: skip
        if runner.mixed_mode != mixed_mode:
            raise ValueError(f"runner runs mixed steps {runner.mixed_mode}, not {mixed_mode}")
        if runner.block_size != block_size or runner.num_blocks < kv_num_blocks:
            raise ValueError(
                f"runner cache ({runner.num_blocks} x {runner.block_size}) does not hold the "
                f"experiment's ({kv_num_blocks} x {block_size})"
            )
        self.runner = runner
        self.latency = latency
        self.time_mode = time_mode
        self.pause_gc = pause_gc
        self.records: list[tuple] = []

    def execute(self, plan, replica, features: tuple) -> float:
        if not self.pause_gc:
            return self._execute(plan, replica, features)
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._execute(plan, replica, features)
        finally:
            if enabled:
                gc.enable()

    def _execute(self, plan, replica, features: tuple) -> float:
        runner = self.runner
        t0 = time.perf_counter()
        batch = plan_to_batch(plan, replica)
        graphs = len(runner.graphs)
        gpu = runner.run_step(batch.prefills, batch.decodes, batch.block_tables)
        wall = time.perf_counter() - t0
        if len(runner.graphs) != graphs:  # this step captured a graph: time a clean replay
            t0 = time.perf_counter()
            batch = plan_to_batch(plan, replica)
            gpu = runner.run_step(batch.prefills, batch.decodes, batch.block_tables)
            wall = time.perf_counter() - t0
        pred = self.latency.step_time(*features) if self.latency is not None else math.nan
        max_dctx = max((n for _, n in batch.decodes), default=0)
        self.records.append((*features[:5], max_dctx, pred, gpu, wall))
        return (wall if self.time_mode == "wall" else gpu) + plan.extra_s

    def warmup(self, steps: int = 3) -> None:
        """Run a few throwaway mixed and decode steps (lazy CUDA/cuBLAS init is not a step)."""
        bt = {0: list(range(64)), 1: list(range(64, 128))}
        for _ in range(steps):
            self.runner.run_step([(0, 512, 0)], [(1, 300)], bt)
            self.runner.run_step([], [(0, 300), (1, 300)], bt)

    def describe(self) -> dict:
        r = self.runner
        return {
            "kind": "real_gpu",
            "time_mode": self.time_mode,
            "kv_layout": r.kv_layout,
            "kv_num_blocks": r.num_blocks,
            "block_size": r.block_size,
            "shared_weights": r.shared_weights,
            "cuda_graphs": r.use_cuda_graphs,
            "mixed_mode": r.mixed_mode,
            **({"piecewise_sizes": list(r.piecewise.sizes)} if r.piecewise else {}),
        }
