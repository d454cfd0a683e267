"""The step-latency interface.

A step is described only by features of its batch composition, never by request identities:

* ``prefill_tokens``  tokens processed as prompt (or chunk, or recompute, or speculative-verify)
                      queries this step, summed over sequences;
* ``prefill_attn``    attention work of those queries: sum over chunks of
                      ``chunk * (context_before + (chunk + 1) / 2)`` = number of (query, key)
                      pairs under a causal mask;
* ``prefill_seqs``    number of sequences contributing prefill tokens;
* ``decode_seqs``     number of sequences decoding one token this step;
* ``decode_ctx``      sum over decoding sequences of their context length (keys read), i.e. the
                      KV-cache bytes read divided by bytes per token;
* ``decode_max``      the longest of those contexts (0: not known, the model assumes its own
                      spread). FlashAttention's decode kernel lasts about as long as its longest
                      sequence takes, so batches with equal totals but different spreads differ.

Prefill work is compute-bound (GEMM FLOPs grow with ``prefill_tokens``); decode work is
memory-bound (weights read once per step, KV read grows with ``decode_ctx``). A model must be
non-decreasing in every feature, with one measured exception: an engine table
(`simulator.latency.engine_steps`) charges a graph-replayed decode step the time it measured at
that CUDA-graph size, and vLLM's FP8 and 4-bit GEMMs make that non-monotone in ``decode_seqs``
(a kernel configuration per range of rows). Times are seconds.

The call is made once per simulated step (hundreds of thousands of times per run), so it takes
plain numbers, not an object. ``step_time`` has no history; the one piece of history a model
may declare is a ``clock_dip`` (`simulator.latency.clock_dip`: decode steps slowed for tens of
ms after a long prefill), which the executor applies per replica on top of ``step_time``.

Decode runs. A replica precomputes runs of decode-only steps (`Replica._plan_decode_run`) in
which every member gains one token of context per step. A model may offer
``decode_run_times(n, ctx, longest, k, start, until)`` for them (same arguments and result as
`decode_run_times` below) to look up what depends only on the batch size once per run; it must
return exactly the floats ``step_time`` would, step by step, and raise the same warnings at the
same steps. Models without it are called through `decode_run_times` (one ``step_time`` a step).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

#: the features above, in `StepLatencyModel.step_time`'s argument order (and every step
#: table's column order)
STEP_FEATURES = (
    "prefill_tokens", "prefill_attn", "prefill_seqs", "decode_seqs", "decode_ctx", "decode_max",
)  # fmt: skip


@runtime_checkable
class StepLatencyModel(Protocol):
    #: short label written in every output, e.g. "roofline" or "profile:h200/llama-3-8b_tp1"
    name: str

    def step_time(
        self,
        prefill_tokens: int,
        prefill_attn: float,
        prefill_seqs: int,
        decode_seqs: int,
        decode_ctx: int,
        decode_max: int = 0,
    ) -> float:
        """Seconds one engine step takes for this batch composition."""
        ...

    def describe(self) -> dict:
        """Metadata for summary.json: kind, source table, hardware, warnings."""
        ...


#: a step launched behind a shorter one gives back the time that one waited for its launch
#: (the pair's total is what an engine-steps table measures), down to this fraction of its own
#: time: the GPU work left once the launch returns
LAUNCHED_STEP_KEEPS = 0.2


def after_launch_wait(t: float, waited: float) -> float:
    """Time of a step of own time ``t`` launched behind a step that waited ``waited`` seconds
    for that launch (`SimulatedExecutor`, `engine_steps.EngineStepModel._attribute`)."""
    return max(t - waited, LAUNCHED_STEP_KEEPS * t)


def chunk_attn_pairs(chunk: int, context_before: int) -> float:
    """Causal (query, key) pairs of a prompt chunk of ``chunk`` tokens after ``context_before``."""
    return chunk * (context_before + (chunk + 1) / 2)


def decode_run_times(
    step_time, n: int, ctx: int, longest: int, k: int, start: float, until: float
) -> list[float]:
    """Times of a run of decode-only steps, one ``step_time(0, 0.0, 0, n, ...)`` call a step.

    Step i (from 0) decodes ``n`` sequences holding ``ctx + i * n`` keys, the longest
    ``longest + i``. The run has at most ``max(k, 1)`` steps and ends with the first step whose
    end is at or after ``until`` (`run_times`). Fast implementations (``decode_run_times``
    methods) must return exactly these floats.
    """
    return run_times(lambda c, m: step_time(0, 0.0, 0, n, c, m), n, ctx, longest, k, start, until)


def run_times(
    time_of, n: int, ctx: int, longest: int, k: int, start: float, until: float
) -> list[float]:
    """`decode_run_times` with the step's time given as ``time_of(ctx, longest)``: at most
    ``max(k, 1)`` steps, ending with the first whose end is at or after ``until``, ends being
    ``start`` plus the step times added one by one in order (the replica's clock; float
    addition is not associative, so the order is part of the contract)."""
    out = []
    t = start
    for _ in range(max(k, 1)):
        dt = time_of(ctx, longest)
        out.append(dt)
        t += dt
        ctx += n
        longest += 1
        if t >= until:
            break
    return out
