"""Step latency fitted on whole engine steps recorded through a serving engine (vLLM).

Why a second kind of table: the op tables of `profiled` time servesim's own torch forward
kernel by kernel. A serving engine's step is more than its kernels (fused inductor graphs, its
FlashAttention 3, full and piecewise CUDA graphs, sampling, async scheduling with host work
overlapped), so its tables are whole steps recorded from the engine itself
(``profiles/vllm_run.py``), and the model is a small regression on those steps.

The model has two regimes, as the engine has:

* **decode-only steps of at most the largest CUDA-graph capture size** replay a full graph
  padded to the next capture size ``P(B)``:
  ``t = W(P(B)) + a_ctx * decode_ctx + a_max * decode_max + S(P(B)) * (decode_max - mean)``,
  ``mean = decode_ctx / B``. ``S`` (piecewise linear over `SKEW_KNOTS`, clamped at the last) is
  what the longest context's excess over the mean costs at that batch size: a decode kernel's
  tail is its longest sequence, and how much of the step that tail holds depends on how many
  sequences share the GPU (one ``a_max`` for every batch under-charged the grid's ``spread``
  steps by 3-6% and vLLM's served batches of 5-16 sequences by 3-7%; validation/vllm-0.24/
  README.md, session 32);
* **decode-only steps above it**, which run eagerly, join the first regime (``P(B) = B``, a
  knot at every measured batch size) when the table measured them at batches well above the
  largest graph (the grid's ``wide`` family: `EAGER_DECODE_FROM`); eager decode is launch-bound
  and uneven in the batch (Qwen3-30B-A3B on an H200: 52-65 ms from 520 to 1,024 sequences
  against 26 ms at 512), which only measured sizes follow. The last eager step of a chain
  shows only the tail of its GPU work (`_ends_eager_chain`: once read as "11 ms at 522
  sequences" on DeepSeek-V2-Lite). Otherwise (the single eager size 513 most tables have)
  they stay in the second;
* **every other step** (any prefill, or more decodes than the largest graph) runs piecewise
  graphs padded the same way up to the largest capture size, eagerly above, over
  ``N = prefill_tokens + decode_seqs`` tokens:
  ``t = G(P(N)) + b_attn * prefill_attn + b_ctx * decode_ctx + b_seq * prefill_seqs
  + b_dec * decode_seqs`` (the LM head and sampler run on sampled rows only, which ``N``
  does not count); with quantized weights (``QUANTIZED_WEIGHTS``) also ``+ b_w * W(P(N))``
  (``W`` at the largest graph above it): the GEMMs of a step of ``N`` rows pick the same
  kernel configuration whether the rows are prompt tokens or decodes, so the decode curve's
  staircase in rows is a feature of these steps too (Llama-3-70B fp8 TP1: a 288-token mixed
  step 86 ms, a 96-token one 28.5 ms; profiles/README.md). bf16 tables leave it out: their
  GEMMs are smooth in rows, and on a MoE model the decode curve holds how many experts a batch
  touches, which a prompt's tokens do not follow.

``W`` and ``G`` are piecewise linear in their argument (values at knots, linear between, the
last segment extended). ``W``'s knots are the CUDA-graph sizes the training steps measured
(`decode_knots`: every size with ``MIN_KNOT_STEPS`` steps or more): the engine replays one graph
per size, and each size's time is its own measurement. They are **not** made monotone: vLLM's
FP8 and 4-bit GEMMs pick a kernel configuration by the batch's rows, and a decode step at batch
136 takes 2.3 ms more than at 128 on an H200 (Llama-3-8B fp8) while 512 is faster than 400
(profiles/README.md); a non-decreasing curve through those sizes over-predicted the largest
batches by up to 60%. ``G``'s knots are fixed (`token_knots`: ``TOKEN_KNOTS``, and a jump from the
largest graph to the next size, where steps turn eager) and its values made non-decreasing. Each
regime is fitted on its own training steps (``split == train``) by minimising the *sum of absolute*
relative errors with non-negative coefficients (median regression: a step that absorbed a host
hiccup moves it little); how many training steps sit far off the fit is reported. So an engine table
is non-decreasing in every feature except the decode batch size of a graph-replayed decode step
(`simulator.latency.base`). Whether a step was planned on an idle engine (its host work overlaps
nothing) is a feature of the fit, so such steps do not bias the busy-engine coefficients;
`step_time` charges busy steps only (the idle coefficient came out 0.0 ms on all three shipped
tables).

Which steps can be fitted, and to what time, is decided from how the engine stamps them
(``profiles/vllm_table.py``): steps planned during a profiling submission burst, the step after
one, and the engine's warm-up scenario are left out; a prefill step launched behind a short
decode step carries the excess of that decode step's stamp (``_attribute``).

Invariant: the held-out steps (``split == test``) are never used by the fit; ``heldout()``
reports the error on them, and the energy model's (`simulator.energy`, fitted on the table's
``energy.csv`` when it has one) on the held-out scenarios' joules.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from statistics import median  # np.median's value on a few floats, without its overhead

import numpy as np
from scipy.optimize import linprog

from simulator.energy import table_energy
from simulator.errors import ConfigError
from simulator.files import csv_records, load_yaml_file, read_text
from simulator.latency.base import LAUNCHED_STEP_KEEPS, STEP_FEATURES, after_launch_wait
from simulator.latency.beyond import BeyondTable
from simulator.latency.clock_dip import ClockDip, fit_clock_dip, row_factors
from simulator.latency.meta_keys import TABLE_META, check_meta_keys
from simulator.latency.step_oracle import cross_pass_oracle, neighbour_oracle

STEP_COLUMNS = [
    "step_id", "scenario", "split", *STEP_FEATURES, "after_idle", "burst", "prefill_behind",
    "dur_us", "group", "proc",
]  # fmt: skip
#: columns a table recorded before repeated passes lacks (``group`` is then the step's own id)
#: or built before rows carried their engine process (``proc`` is then 0: one process)
OPTIONAL_COLUMNS = ("group", "proc")
#: eager decode-only batches join the decode curve when the table measured one this many times
#: the largest CUDA graph or more (module docstring)
EAGER_DECODE_FROM = 1.25
#: eager decode sizes within this fraction of each other share a knot (`_eager_sizes`)
EAGER_KNOT_SPREAD = 0.01
#: a CUDA-graph size becomes a knot of the decode curve when this many training steps ran at it
MIN_KNOT_STEPS = 3
TOKEN_KNOTS = (1, 256, 1024, 4096, 8192, 16384)
#: graph sizes at which the cost of a decode batch's longest context over its mean is a
#: coefficient of its own (linear between, the last one's beyond; module docstring)
SKEW_KNOTS = (1, 64, 512)
#: rounds of (clock dip on the steady fit's residuals, steady fit without the dip): the
#: first steady fit absorbs part of the dip into the decode curve, the second gives it back
DIP_ROUNDS = 2
#: weight precisions whose GEMM kernels are a staircase in rows (vLLM's CUTLASS FP8, Machete)
QUANTIZED_WEIGHTS = ("fp8", "int4")
#: a training step whose first-fit relative error exceeds this many times the median is dropped
OUTLIER_FACTOR = 5.0
#: a step whose stamp interval exceeds its predicted own time this many times waited for the
#: launch of the step behind it
LAUNCH_SHOWS = 1.1
#: attributed launches a kind (graph / eager) needs before any is charged; fewer charge none
MIN_LAUNCHES = 3


def token_knots(max_graph: int, eager_jump: bool) -> tuple[int, ...]:
    """``G``'s knots: `TOKEN_KNOTS`, plus, when the table's steps jump where they stop
    replaying piecewise CUDA graphs (``eager_jump``, `eager_jump_shows`), the largest graph and
    the next size, so that ``G`` can jump there. Why: eager execution pays its host launches
    inside the step, and on a host-bound engine that is most of it (Qwen3-30B-A3B at TP2 on two
    H200s: steps of 257-512 tokens 15-18 ms, of 513-768 tokens 83 ms, flat near 85-100 ms up to
    8k tokens); a segment from 256 to 1,024 tokens spread that cliff over both sides
    (with-prefill held-out median 9%, p95 47%). Tables without the jump keep the fixed knots:
    two more knot values fitted where no jump is cost the H100 Llama-3-8B table 3.5 points of
    held-out p95 (small prompt steps moved)."""
    if max_graph <= 0 or not eager_jump:
        return TOKEN_KNOTS
    return tuple(sorted({*TOKEN_KNOTS, max_graph, max_graph + 1}))


#: training steps with prompt tokens just above the largest graph (`eager_jump_shows`) whose
#: median stamp interval is this many times that of the steps just below it make a jump
EAGER_JUMP = 1.5
#: the bands compared: this fraction of the largest graph below it and above it
EAGER_JUMP_BAND = 0.25


def eager_jump_shows(rows: list[dict], max_graph: int) -> bool:
    """Whether training steps with prompt tokens jump at the largest graph: the median stamp
    interval of those of ``(M, (1 + band) M]`` tokens over that of ``((1 - band) M, M]``
    reaches `EAGER_JUMP` (``M`` the largest graph; a step's cost linear in its tokens gives at
    most ~1.3 between the bands), with 3 steps or more in each band. Training steps only:
    which knots the fit has is part of the fit."""
    lo, hi = [], []
    for r in rows:
        if r["split"] != "train" or not r["prefill_tokens"] or r["burst"] or not r["dur_us"]:
            continue
        n = r["prefill_tokens"] + r["decode_seqs"]
        if (1 - EAGER_JUMP_BAND) * max_graph < n <= max_graph:
            lo.append(r["dur_us"])
        elif max_graph < n <= (1 + EAGER_JUMP_BAND) * max_graph:
            hi.append(r["dur_us"])
    if len(lo) < 3 or len(hi) < 3:
        return False
    return median(hi) >= EAGER_JUMP * median(lo)


def hat(x: float, knots: tuple) -> list[float]:
    """Weights of piecewise-linear interpolation at ``x`` over ``knots`` (extended linearly
    beyond both ends by the outermost segment)."""
    w = [0.0] * len(knots)
    j = min(max(bisect.bisect_right(knots, x) - 1, 0), len(knots) - 2)
    u = (x - knots[j]) / (knots[j + 1] - knots[j])
    w[j], w[j + 1] = 1.0 - u, u
    return w


@dataclass(frozen=True)
class Frontend:
    """The serving path outside the engine loop, measured by the profiler (``meta.yaml``
    ``frontend``): a request reaches the engine ``input_s(prompt_tokens)`` after it reaches
    the server, a token reaches the client ``output_s`` after the engine emits it, and an idle
    engine plans ``idle_plan_s`` later than a running one would (its loop wakes first)."""

    input_base_s: float
    input_per_token_s: float
    output_s: float
    idle_plan_s: float = 0.0

    def input_s(self, prompt_tokens: int) -> float:
        return self.input_base_s + self.input_per_token_s * prompt_tokens


class EngineStepModel:
    """Whole-step model of one (engine, GPU, model, TP) table; see the module docstring."""

    def __init__(self, table_dir: str | Path, model_name: str, tp: int):
        self.dir = Path(table_dir)
        self.meta = _read_meta(self.dir)
        self._check_matches(model_name, tp)
        comp = (self.meta.get("engine_config") or {}).get("compilation") or {}
        self.capture_sizes = sorted(int(x) for x in comp.get("cudagraph_capture_sizes") or [])
        self.max_graph = self.capture_sizes[-1] if self.capture_sizes else 0
        self.rows = read_steps_csv(self.dir / "steps.csv")
        self.token_knots = token_knots(self.max_graph, eager_jump_shows(self.rows, self.max_graph))
        #: quantized GEMMs pick a kernel configuration by rows: steps with prompt tokens also
        #: carry the decode curve's value at their padded size (module docstring)
        weights = (self.meta.get("precision") or {}).get("weights", "bf16")
        self.rows_staircase = weights in QUANTIZED_WEIGHTS
        #: the largest decode-only batch and step (tokens) the table measured: a run's step
        #: beyond either is extrapolated, and the run says so (`beyond`: the largest, per kind)
        self.decode_seqs_measured = max(
            (r["decode_seqs"] for r in self.rows if r["prefill_tokens"] == 0), default=0
        )
        self.tokens_measured = max(r["prefill_tokens"] + r["decode_seqs"] for r in self.rows)
        #: what the table itself says (e.g. `select`'s routing warning); a run's
        #: extrapolations are in `beyond`
        self.warnings: list[str] = []
        #: for a mixture of experts, its decode steps against the uniform-routing bound
        #: (`simulator.latency.routing_check`; set by `select`), else None
        self.routing: dict | None = None
        #: launches charged at another host's level (`scale_launches`; set by `select`), or None
        self.launch_scale: dict | None = None
        #: the largest decode-only batch on the decode curve (`_on_decode_curve`)
        self.decode_top = self._decode_top()
        fe = self.meta.get("frontend") or {}
        self.frontend = (
            Frontend(
                fe["input_s"], fe["input_s_per_token"], fe["output_s"], fe.get("idle_plan_s", 0.0)
            )
            if fe
            else None
        )
        engine = self.meta["engine"]
        gpu_dir = self.meta["gpu"]["key"]
        # the folder names the model, its precision and TP (``llama-3-8b_fp8_tp1``)
        self.name = f"engine:{engine['name']}-{engine['version']}/{gpu_dir}/{self.dir.name}"
        self.beyond = BeyondTable(f"{self.name}: ", "; extrapolated")
        #: the steps' energy (`simulator.energy`), or None and why not (a TDP estimate then)
        self.energy, self.energy_note = table_energy(self.dir, self.meta, self.name, tp)
        # first without launched pairs; then the pairs behind decode steps as the fit says
        # they ran (no launch time is known yet, so none behind a prefill step shows), which
        # gives the launch times; then also those behind prefill steps. The decode curve's
        # knots are taken on the first pass, which leaves the fewest steps a target.
        self.decode_knots: tuple[int, ...] | None = None
        self._first_eager: int | None = None
        #: decode steps slowed after a long prefill (`clock_dip`), fitted on the steady fit's
        #: training residuals, then the steady fit on targets with the dip taken out, in turn
        self.clock_dip: ClockDip | None = None
        for r in self.rows:
            r["dip"] = 1.0
        for _ in range(3):
            self._fit_round()
        for _ in range(DIP_ROUNDS):
            self.clock_dip = self._fit_clock_dip()
            if self.clock_dip is None:
                break
            self.set_row_dips(self.rows)
            self._fit_round()

    @classmethod
    def as_measured(cls, table_dir: str | Path) -> EngineStepModel:
        """The table's model for the model and TP its own ``meta.yaml`` names: for reports that
        read a table without an experiment (`servesim profile report` / `tables`). A meta.yaml
        without them is a ConfigError naming it (`_read_meta`)."""
        meta = _read_meta(Path(table_dir))
        return cls(table_dir, meta["model"]["name"], int(meta["tp"]))

    def _fit_round(self) -> None:
        self._attribute()
        self.fit(median_of_repeats([r for r in self.rows if r["split"] == "train"]))
        self._fit_launch([r for r in self.rows if r["split"] == "train" and not r["burst"]])

    def _fit_clock_dip(self) -> ClockDip | None:
        """The dip (`simulator.latency.clock_dip`) on the training decode-only steps' excess
        over the steady fit, every step timed alone (a later pass's step sits at its own time
        after its own prefill)."""
        fitted = [
            r["split"] == "train" and not r["prefill_tokens"] and _usable(r) for r in self.rows
        ]
        excess = [  # over the steady time (`_own` less the row's current dip factor)
            r["target"] * r["dip"] / self._own(r) - 1 if f else 0.0
            for r, f in zip(self.rows, fitted, strict=True)
        ]
        return fit_clock_dip(self.rows, fitted, excess)

    def set_row_dips(self, rows: list[dict]) -> None:
        """Give recorded steps (in recorded order; a table's or a serving replay's) the dip
        factor the simulator would charge them (``dip``, read by `predict_row`)."""
        for r, f in zip(rows, row_factors(self.clock_dip, rows), strict=True):
            r["dip"] = f

    def _check_matches(self, model_name: str, tp: int) -> None:
        got = (self.meta["model"]["name"], int(self.meta["tp"]))
        if got != (model_name, tp):
            raise ConfigError(
                str(self.dir / "meta.yaml"),
                "model",
                f"table measured {got[0]} at tp {got[1]}, but the experiment serves "
                f"{model_name} at tp {tp}",
            )

    # -- features ------------------------------------------------------------------------------
    def padded(self, n: int) -> int:
        """The CUDA-graph size a batch of ``n`` tokens runs at (``n`` beyond the largest)."""
        i = bisect.bisect_left(self.capture_sizes, n)
        return self.capture_sizes[i] if i < len(self.capture_sizes) else n

    def runs_in_graph(self, tokens: int) -> bool:
        """Whether a step of ``tokens`` tokens replays a CUDA graph (is launched as one) rather
        than running eager code above the largest capture size."""
        return tokens <= self.max_graph

    def _decode_top(self) -> int:
        """The largest graph, or the largest measured decode-only batch when the table measured
        eager ones at ``EAGER_DECODE_FROM`` x the largest graph or more (module docstring)."""
        top = self.decode_seqs_measured
        return top if top >= EAGER_DECODE_FROM * self.max_graph else self.max_graph

    def _on_decode_curve(self, prefill_tokens: int, decode_seqs: int) -> bool:
        return prefill_tokens == 0 and 0 < decode_seqs <= self.decode_top

    def _decode_x(self, b, ctx, mx, idle=0) -> list[float]:
        mx = mx or ctx / b  # 0: longest context unknown, assume the batch's mean
        skew = [(mx - ctx / b) * h for h in self._skew_hat(b)]
        return hat(self._curve_size(b), self.decode_knots) + [ctx, mx, idle, *skew]

    def _skew_hat(self, b: int) -> list[float]:
        """The weights of `SKEW_KNOTS` at the graph size a batch of ``b`` runs at (clamped)."""
        return hat(min(self.padded(b), SKEW_KNOTS[-1]), SKEW_KNOTS)

    def _mixed_x(self, pt, attn, ps, b, ctx, idle=0) -> list[float]:
        p = self.padded(pt + b)
        x = hat(p, self.token_knots) + [attn, ctx, ps, b, idle]
        if self.rows_staircase:  # the decode curve's value at the step's rows (module docstring)
            x.append(self._graph_w[p if p <= self.max_graph else self.max_graph])
        return x

    # -- fit -----------------------------------------------------------------------------------
    def _attribute(self) -> None:
        """Each row's ``target`` (seconds): its own stamp interval, except around a launch that
        showed. A step with prompt tokens planned behind a running step (``prefill_behind``),
        or an eager decode-only step behind a step that is not one (`_launched_behind`), is
        launched before the loop takes that step's outputs; when the running step's stamp
        interval (``wait_s``) exceeds its predicted own time by over 10%, the launch showed:

        * the running step gets no target (it only tells the launch time, `_fit_launch`;
          ``next_tokens`` is the launched step's token count);
        * the launched step's target is the pair's total less the running step's own time,
          which is what the simulator charges it (`SimulatedExecutor`: the running step lasts
          the launch, the launched one its time less that wait, at least a fifth of it), when
          the pair was GPU-bound; when the launch outlasted both steps' GPU work (the launched
          step's time less the wait is under a fifth of it) the pair says nothing of that
          step's GPU time: no target either.

        Needs a fitted model; the first pass, without one, takes every decode step followed by
        a launch as waiting and leaves both steps without a target. Behind a prefill step it
        also needs the launch times (`_fit_launch`, from the pairs behind decode steps): only a
        step shorter than the launch can wait for it (a chain of 8,192-token chunks hides every
        launch). The last eager decode step of a chain has no target either
        (`_ends_eager_chain`)."""
        fitted = hasattr(self, "c_dec")
        prev = None
        for r in self.rows:
            r["target"] = r["dur_us"] * 1e-6
            r["next_tokens"] = 0
            r["charged_s"] = None
            if prev is not None and self._launched_behind(prev, r):
                if fitted:
                    self._attribute_launch(prev, r)
                elif prev["prefill_tokens"] == 0:
                    prev["target"] = r["target"] = None
            if prev is not None and self._ends_eager_chain(prev, r):
                prev["target"] = None
            prev = r

    def _launched_behind(self, prev: dict, r: dict) -> bool:
        """Whether ``r`` was launched while ``prev`` ran, with a launch long enough to show in
        ``prev``'s stamp interval: a step with prompt tokens planned behind a running step
        (``prefill_behind``), or a decode-only step above the largest CUDA graph (eager: its
        launch is eager code, tens of ms, like a prompt step's above it) planned behind a step
        that is not one too. Why the second: after a prompt step, Qwen3-30B-A3B's first
        513-sequence decode step measures 12 ms and the prompt step 60 ms where their own times
        are ~25 and ~30 ms: the decode's launch sat in the prompt step's interval, and fitted
        as its own time it took the curve's 520-sequence value to 0. In a chain of eager decode
        steps each interval is the steady max of launch and GPU time, which the curve fits."""
        if r["prefill_behind"]:
            return True
        if r["prefill_tokens"] or r["after_idle"] or not self.max_graph:
            return False
        eager = r["decode_seqs"] > self.max_graph
        return eager and (prev["prefill_tokens"] > 0 or prev["decode_seqs"] <= self.max_graph)

    def _ends_eager_chain(self, prev: dict, r: dict) -> bool:
        """Whether ``prev`` is an eager decode-only step followed by a graph-replayed decode
        step. Its stamp interval is then neither its own time nor a steady one: its launch sat
        in the interval before it (`_launched_behind`), and the launch behind it is a graph's
        (~1 ms), so only the tail of its GPU work shows (Qwen3-30B-A3B on an H200: 9-12 ms
        where eager decode steps followed by eager ones take 52-65 ms). No target: the decode
        curve's eager sizes are fitted on steps followed by eager ones, which is what a chain
        of eager steps costs."""
        if not self.max_graph or prev["prefill_tokens"] or r["prefill_tokens"]:
            return False
        return prev["decode_seqs"] > self.max_graph >= r["decode_seqs"]

    def _attribute_launch(self, prev: dict, r: dict) -> None:
        """One pair: ``prev`` ran while ``r`` was launched. ``prev``'s time before any wait is
        what the simulator charges it: its own, less the wait it was launched behind
        (``charged_s``, when it was itself a launched step whose launch showed)."""
        wait, ran = prev["dur_us"] * 1e-6, prev["charged_s"] or self._own(prev)
        if wait <= LAUNCH_SHOWS * ran:
            return  # the launch hid under the running step
        if prev["prefill_tokens"] and ran >= self.launch_s(r["prefill_tokens"] + r["decode_seqs"]):
            return  # a prefill step longer than the launch: it waited for something else
        prev["next_tokens"] = r["prefill_tokens"] + r["decode_seqs"]
        prev["wait_s"] = wait
        prev["target"] = None
        excess, own = wait - ran, self._own(r)
        r["charged_s"] = after_launch_wait(own, excess)
        r["target"] = r["target"] + excess if own - excess >= LAUNCHED_STEP_KEEPS * own else None

    def _launched_pairs(self, rows: list[dict]) -> list[tuple[float, float]]:
        """(charged, measured) seconds of each pair in ``rows`` whose launch showed: the
        running step and the step launched behind it, charged as `SimulatedExecutor` does with
        the median launch time (it draws each launch from the measured ones)."""
        out = []
        for prev, r in zip(rows, rows[1:], strict=False):
            if not prev["next_tokens"] or prev["burst"] or r["burst"]:
                continue
            ran = prev["charged_s"] or self._own(prev)
            wait = max(0.0, self.launch_s(prev["next_tokens"]) - ran)
            own = self._own(r)
            out.append(
                (ran + wait + after_launch_wait(own, wait), (prev["dur_us"] + r["dur_us"]) * 1e-6)
            )
        return out

    def _fit_launch(self, train: list[dict]) -> None:
        """Launch time of a step on the engine loop, per kind (within the largest CUDA graph:
        a graph replay; above it: eager inductor code, tens of ms): the stamp intervals of the
        decode steps whose outputs clearly waited for it (`_attribute`), kept whole
        (``launch_waits``, sorted: the host's spread is what makes token gaps spread) and as
        their median (``launch``). Fewer than `MIN_LAUNCHES` such steps: 0 (nothing is charged).

        Only behind a decode step is the interval the launch: a decode step's own GPU time is
        short, while behind a step with prompt tokens the interval also holds that step's GPU
        time, which the model may under-predict (then the whole interval reads as a launch).
        Those intervals still mark their pairs (`_attribute`) but give no launch time (and
        without 3 launches behind decode steps none behind a prefill step is attributed).
        Why: DeepSeek-V2-Lite's H200 table held 59 eager launches behind decode steps (median
        83 ms, as its raw stamps say, `profiles.diag_launch`) and 668 behind 8k-token prefill
        chunks (102 ms); pooled, it charged every eager launch 101 ms.

        Launches of several engine processes (a run resumed, or one pass per engine) are put
        on one scale first (`launches_across_processes`): the launch time is drawn per
        process, so each process is one draw of its level and the table's is their median."""
        by_proc: dict[bool, dict[int, list[float]]] = {True: {}, False: {}}
        for g, rows in self.launch_rows(train).items():
            for r in rows:
                by_proc[g].setdefault(r["proc"], []).append(r["wait_s"])
        #: launches attributed per kind, also where too few leave the kind uncharged: how
        #: much the launch time of a table stands on (a handful is a thin sample of a host's spread)
        self.launch_counts = {k: sum(map(len, v.values())) for k, v in by_proc.items()}
        #: per kind, the median launch of each engine process with `MIN_LAUNCHES` or more
        self.launch_process_medians = {k: process_medians(v) for k, v in by_proc.items()}
        self.launch_waits = {
            k: launches_across_processes(v) if self.launch_counts[k] >= MIN_LAUNCHES else [0.0]
            for k, v in by_proc.items()
        }
        self.launch = {k: float(np.median(v)) for k, v in self.launch_waits.items()}

    def scale_launches(self, how: float | str) -> None:
        """Charge launches as a host of another speed would: every launch time of a kind
        (``launch_waits``, ``launch``) times that kind's factor. ``how``: a number (> 0, one
        factor for both kinds), ``slowest`` or ``fastest`` (per kind, the slowest or fastest of
        the table's engine processes' median launches over the table's level; a kind with fewer
        than two such processes keeps 1). Recorded in ``launch_scale`` (`describe`).

        Why: the launch of a step is drawn per engine process, and a serving run is one
        process (`launches_across_processes`); a table charges its processes' median level.
        Asking for another level shows how much of a prediction rests on that draw (H100
        DeepSeek-V2-Lite's three processes launched eager prompt steps at 64-85 ms,
        validation/vllm-0.24/launch_band.md). Raises ValueError for another ``how``, or for
        ``slowest`` / ``fastest`` on a table whose launches come from one engine process."""
        if isinstance(how, str):
            if how not in ("slowest", "fastest"):
                raise ValueError(f"expected a number > 0, slowest or fastest, got {how!r}")
            pick = max if how == "slowest" else min
            factors = {}
            for g, medians in self.launch_process_medians.items():
                level = self.launch[g]
                factors[g] = pick(medians.values()) / level if len(medians) > 1 and level else 1.0
            if all(len(m) < 2 for m in self.launch_process_medians.values()):
                raise ValueError(f"the table's launches come from one engine process; {how} "
                                 "needs two or more (give a number instead)")  # fmt: skip
        elif how > 0:
            factors = {True: float(how), False: float(how)}
        else:
            raise ValueError(f"expected a number > 0, slowest or fastest, got {how!r}")
        self.launch_waits = {g: [w * factors[g] for w in v] for g, v in self.launch_waits.items()}
        self.launch = {g: v * factors[g] for g, v in self.launch.items()}
        self.launch_scale = {"asked": how, "graph": factors[True], "eager": factors[False]}

    def launch_rows(self, rows: list[dict]) -> dict[bool, list[dict]]:
        """The decode-only steps of ``rows`` whose stamp interval held a launch
        (`_attribute_launch`: ``next_tokens`` and ``wait_s`` set), by the launched step's kind
        (True: within the largest CUDA graph); what `_fit_launch` takes its launch times from."""
        out: dict[bool, list[dict]] = {True: [], False: []}
        for r in rows:
            if r["next_tokens"] and r["prefill_tokens"] == 0:
                out[self.runs_in_graph(r["next_tokens"])].append(r)
        return out

    def launch_s(self, tokens: int) -> float:
        """Host time to launch a step of ``tokens`` tokens (`_fit_launch`)."""
        return self.launch[self.runs_in_graph(tokens)]

    def launch_quantile_s(self, tokens: int, u: float) -> float:
        """The ``u``-quantile (0 <= u <= 1) of the measured launch times of a step of ``tokens``
        tokens' kind (`_fit_launch`; several engine processes' on one scale,
        `launches_across_processes`); `SimulatedExecutor` draws each launch this way."""
        return sorted_quantile(self.launch_waits[self.runs_in_graph(tokens)], u)

    def fit(self, train: list[dict]) -> None:
        """Non-negative median regression on relative error, each regime on its own steps."""
        train = [r for r in train if r["target"] is not None]
        dec = [r for r in train if self._on_decode_curve(r["prefill_tokens"], r["decode_seqs"])]
        mix = [r for r in train if not self._on_decode_curve(r["prefill_tokens"], r["decode_seqs"])]
        if self.decode_knots is None:
            self.decode_knots = tuple(sorted({*self._measured_sizes(dec), *self._eager_sizes()}))
            #: the curve's smallest knot above the largest graph (None: no eager knot)
            self._first_eager = next((k for k in self.decode_knots if k > self.max_graph), None)
        if len(self.decode_knots) < 2 or len(mix) < 2 * len(self.token_knots):
            raise ConfigError(
                str(self.dir / "steps.csv"),
                "split",
                f"too few training steps to fit ({len(dec)} decode-only at "
                f"{len(self.decode_knots)} graph sizes with {MIN_KNOT_STEPS}+ steps, "
                f"{len(mix)} other)",
            )
        self.c_dec, n_dec = self._fit_regime(dec, self._row_decode_x, 0)
        self._graph_w = {p: self._curve_w(p) for p in self.capture_sizes}
        #: `_decode_coeffs` per decode batch (curve value, skew cost), read by `step_time`
        #: (cleared with each fit)
        self._decode_w: dict[int, tuple[float, float]] = {}
        self.c_mix, n_mix = self._fit_regime(mix, self._row_mixed_x, len(self.token_knots))
        k = len(self.decode_knots)
        self._c_ctx, self._c_max, self._c_idle = (float(c) for c in self.c_dec[k : k + 3])
        self._c_skew = [float(c) for c in self.c_dec[k + 3 : k + 3 + len(SKEW_KNOTS)]]
        self.far_off = n_dec + n_mix
        self.train_steps = len(train)

    def _curve_size(self, b: int) -> int:
        """Where a decode batch of ``b`` reads the decode curve: at its graph size (`padded`),
        except an eager batch below the curve's first eager knot, which reads that knot. The
        segment below it starts at the largest graph, a regime such a batch does not run in:
        on H200 DeepSeek-V2-Lite it charged 520 eager sequences 54 ms, a third of the way from
        the 512 graph's time to the first eager knot's (539), where they took 95 ms."""
        p = self.padded(b)
        first = self._first_eager
        return first if first is not None and self.max_graph < p < first else p

    def _measured_sizes(self, dec: list[dict]) -> tuple[int, ...]:
        """The sizes at least ``MIN_KNOT_STEPS`` of the decode steps ``dec`` ran at: CUDA-graph
        sizes, and above the largest graph each eager batch size itself (`padded` returns it),
        which is what puts a knot at every measured eager size (module docstring; restricting
        this to graph sizes alone once took a table's held-out p95 from 26% to 199%)."""
        runs = Counter(self.padded(r["decode_seqs"]) for r in dec)
        return tuple(sorted(p for p, n in runs.items() if n >= MIN_KNOT_STEPS))

    def _eager_sizes(self) -> set[int]:
        """Knots for eager decode-only batches (above the largest graph, up to `decode_top`):
        sizes within ``EAGER_KNOT_SPREAD`` of each other join one knot (the size most of their
        training steps ran at) when ``MIN_KNOT_STEPS`` steps ran there, every pass's step
        counted. A wide batch draining visits a slightly different size each pass (522, 524,
        524), and after `median_of_repeats` each would count once: without this the curve
        jumps straight from the largest graph to the widest batch, across the cliff eager
        decode can have (module docstring)."""
        runs = Counter(
            r["decode_seqs"]
            for r in self.rows
            if r["split"] == "train" and not r["prefill_tokens"]
            and self.max_graph < r["decode_seqs"] <= self.decode_top
        )  # fmt: skip
        knots, group = set(), []
        for b in sorted(runs):
            if group and b > group[0] * (1 + EAGER_KNOT_SPREAD):
                knots.add(self._eager_knot(group, runs))
                group = []
            group.append(b)
        if group:
            knots.add(self._eager_knot(group, runs))
        return {k for k in knots if k is not None}

    @staticmethod
    def _eager_knot(group: list[int], runs: Counter) -> int | None:
        if sum(runs[b] for b in group) < MIN_KNOT_STEPS:
            return None
        return max(group, key=lambda b: (runs[b], b))

    def _row_decode_x(self, r: dict) -> list[float]:
        return self._decode_x(r["decode_seqs"], r["decode_ctx"], r["decode_max"], r["after_idle"])

    def _row_mixed_x(self, r: dict) -> list[float]:
        return self._mixed_x(
            r["prefill_tokens"],
            r["prefill_attn"],
            r["prefill_seqs"],
            r["decode_seqs"],
            r["decode_ctx"],
            r["after_idle"],
        )

    @staticmethod
    def _fit_regime(rows: list[dict], xf, n_monotone: int) -> tuple[np.ndarray, int]:
        """Coefficients of ``xf``'s features on ``rows`` and how many rows sit far off; the
        first ``n_monotone`` (a curve's knot values) are made non-decreasing."""
        x = np.array([xf(r) for r in rows])
        y = np.array([r["target"] / r["dip"] for r in rows])  # the steady time
        scale = x.max(axis=0)
        scale[scale == 0] = 1.0
        coef = l1_fit(x / scale / y[:, None])
        rel = np.abs(x @ (coef / scale) / y - 1)
        far = int((rel > OUTLIER_FACTOR * max(float(np.median(rel)), 0.005)).sum())
        coef = coef / scale
        coef[:n_monotone] = np.maximum.accumulate(coef[:n_monotone])
        return coef, far

    # -- the StepLatencyModel interface --------------------------------------------------------
    def step_time(
        self,
        prefill_tokens: int,
        prefill_attn: float,
        prefill_seqs: int,
        decode_seqs: int,
        decode_ctx: int,
        decode_max: int = 0,
    ) -> float:
        if prefill_tokens == 0 and 0 < decode_seqs <= self.decode_top:  # `_on_decode_curve`
            # `_graph_decode_s` inline (a decode step is most steps): the same expression
            hit = self._decode_w.get(decode_seqs)
            if hit is None:
                hit = self._decode_w[decode_seqs] = self._decode_coeffs(decode_seqs)
                if self.padded(decode_seqs) > self.decode_knots[-1]:
                    self._beyond_curve(decode_seqs)
            w, s = hit
            mean = decode_ctx / decode_seqs
            mx = decode_max or mean
            return w + self._c_ctx * decode_ctx + self._c_max * mx + s * (mx - mean)
        if prefill_tokens + decode_seqs > self.tokens_measured or (
            not prefill_tokens and decode_seqs > self.decode_seqs_measured
        ):
            self._beyond_table(prefill_tokens, decode_seqs)
        x = self._mixed_x(prefill_tokens, prefill_attn, prefill_seqs, decode_seqs, decode_ctx)
        return float(np.dot(x, self.c_mix))

    def _graph_decode_s(self, b: int, ctx: int, mx: int) -> float:
        """A graph-replayed decode step of ``b`` sequences on a busy engine: the measured
        graph size's value (`_graph_w`) plus its KV read and longest-context terms."""
        mx = mx or ctx / b  # as `_decode_x`
        w, s = self._decode_coeffs(b)
        return w + self._c_ctx * ctx + self._c_max * mx + s * (mx - ctx / b)

    def _decode_coeffs(self, b: int) -> tuple[float, float]:
        """A decode batch of ``b``: its curve value (`_graph_w_of`) and the cost per token of
        its longest context over the mean, at most ``b * a_ctx``. Why the cap: at a fixed
        longest context the step's time moves with ``decode_ctx`` by ``a_ctx - S / b``; at the
        cap it is flat (the step waits for its longest sequence whatever the others hold),
        above it more keys would cost less time, which no kernel does and the latency contract
        forbids (`simulator.latency.base`). A fit can land there by noise (H200 Llama-3-8B fp8
        at 2 sequences: 4% over)."""
        s = sum(c * h for c, h in zip(self._c_skew, self._skew_hat(b), strict=True))
        return self._graph_w_of(b), min(s, b * self._c_ctx)

    def _graph_w_of(self, b: int) -> float:
        """`_graph_w` at the graph size a decode batch of ``b`` runs at (`padded`), computed
        and kept there for an eager size (tables with the `wide` family)."""
        p = self._curve_size(b)
        w = self._graph_w.get(p)
        if w is None:
            w = self._graph_w[p] = self._curve_w(p)
        return w

    def _curve_w(self, p: int) -> float:
        """The decode curve's base value at batch size ``p`` (its knots' coefficients). Beyond
        the last knot the outermost segment extends the curve, unless it falls: a decode batch
        larger than any measured one is never charged less than the largest knot's value (a
        falling last segment, noise between two eager sizes, once extrapolated a 1,024-sequence
        batch of a one-pass table to a negative time). Invariant: the knots' coefficients are
        non-negative (`l1_fit`), so every value is."""
        knots, c = self.decode_knots, self.c_dec[: len(self.decode_knots)]
        if p > knots[-1] and c[-1] < c[-2]:
            return float(c[-1])
        return float(np.dot(hat(p, knots), c))

    def _beyond_table(self, prefill_tokens: int, decode_seqs: int) -> None:
        """Note a step beyond what the table measured (a decode-only batch above its largest,
        or more tokens than its largest step): its time is the fitted curve's extrapolation,
        which the held-out error does not cover (`BeyondTable`: the run records the largest)."""
        if prefill_tokens:
            self.beyond.note(
                "tokens", "a step of {} tokens (largest measured: {}) is beyond the table",
                prefill_tokens + decode_seqs, self.tokens_measured, stacklevel=3,
            )  # fmt: skip
        else:
            self.beyond.note(
                "decode", "a decode-only batch of {} sequences (largest measured: {}) is beyond "
                "the table", decode_seqs, self.decode_seqs_measured, stacklevel=3,
            )  # fmt: skip

    def _beyond_curve(self, decode_seqs: int) -> None:
        """Note a decode-only batch above the decode curve's last knot but within `decode_top`
        (the largest CUDA graph, or the widest eager batch measured): graph sizes above the
        widest measured batch, or eager batches too few steps made a knot of. The curve there
        extends its last segment (`_curve_w`), which the held-out error does not cover."""
        self.beyond.note(
            "decode_curve",
            "a decode-only batch of {} sequences is beyond the decode curve's last measured size "
            "({}; widest decode-only batch measured: {})",
            decode_seqs, self.decode_knots[-1], self.decode_seqs_measured, stacklevel=3,
        )  # fmt: skip

    def _own(self, r: dict) -> float:
        """The step's time from its regime's coefficients (its idle start included): what
        `step_time` charges, plus the idle term, times its clock-dip factor (``dip``, 1 where
        `set_row_dips` has not run: the steady time)."""
        if self._on_decode_curve(r["prefill_tokens"], r["decode_seqs"]):
            busy = self._graph_decode_s(r["decode_seqs"], r["decode_ctx"], r["decode_max"])
            return (busy + self._c_idle * r["after_idle"]) * r.get("dip", 1.0)
        return float(np.dot(self._row_mixed_x(r), self.c_mix)) * r.get("dip", 1.0)

    def predict_row(self, r: dict) -> float:
        """Predicted time of one recorded step (its idle start included; an exposed prefill
        step's time includes the launch its predecessor waited for, as its target does)."""
        return self._own(r)

    def heldout(self) -> dict:
        """Error of the model on the steps it was not fitted on (|sim / real - 1|), and of its
        energy model on the held-out scenarios' joules (or why there is none)."""
        test = [r for r in self.rows if r["split"] == "test"]
        judged = median_of_repeats(test)
        out = error_summary(self, judged)
        out["worst_scenarios"] = worst_scenarios(self, judged)
        single = [r for r in test if _usable(r)]
        out["single_intervals"] = error_summary(self, single)["all"]
        out["repeat_spread"] = repeat_spread(test)
        out["neighbour_oracle"] = neighbour_oracle(self, judged, _abs_err_stats)
        out["cross_pass_oracle"] = cross_pass_oracle(self, single, _abs_err_stats)
        pairs = self._launched_pairs(test)
        out["launched_pairs"] = _abs_err_stats([c / m - 1 for c, m in pairs])
        out["energy"] = self.energy.heldout() if self.energy else self.energy_note
        return out

    def describe(self) -> dict:
        return {
            "name": self.name,
            "kind": "engine_steps",
            "table": str(self.dir),
            "engine": self.meta["engine"],
            "gpu": self.meta["gpu"],
            "created_utc": self.meta.get("created_utc"),
            "fit": {"train_steps": self.train_steps, "train_steps_far_off": self.far_off},
            "decode_graph_sizes_measured": list(self.decode_knots),
            "launch_s": {"graph": self.launch[True], "eager": self.launch[False]},
            "launch_waits": {
                kind: {
                    "steps": self.launch_counts[g],
                    "p10": sorted_quantile(self.launch_waits[g], 0.1),
                    "p90": sorted_quantile(self.launch_waits[g], 0.9),
                    # several engine processes: each one's median (`launches_across_processes`)
                    **(
                        {"process_medians": list(self.launch_process_medians[g].values())}
                        if len(self.launch_process_medians[g]) > 1
                        else {}
                    ),
                }
                for kind, g in (("graph", True), ("eager", False))
            },
            **({"launch_scale": self.launch_scale} if self.launch_scale is not None else {}),
            "frontend": self.meta.get("frontend") or "not measured",
            "clock_dip": self.clock_dip.describe() if self.clock_dip else "none fitted",
            **({"routing_check": self.routing} if self.routing is not None else {}),
            "warnings": self.warnings + self.beyond.texts(),
        }


def error_summary(model, rows: list[dict]) -> dict:
    """Median / p95 / max absolute relative error of ``model`` on measured steps, overall and by
    kind (decode-only vs with prefill)."""

    def stats(sel):
        return _abs_err_stats([model.predict_row(r) / r["target"] - 1 for r in sel])

    dec = [r for r in rows if r["prefill_tokens"] == 0]
    mix = [r for r in rows if r["prefill_tokens"] > 0]
    return {"all": stats(rows), "decode_only": stats(dec), "with_prefill": stats(mix)}


#: the per-step floor a shipped table is held to (p95 of |error|), and how many scenarios
#: `worst_scenarios` names
STEP_FLOOR = 0.10
WORST_SCENARIOS = 5


def worst_scenarios(model, rows: list[dict]) -> list[dict]:
    """The held-out scenarios with the most steps off by more than `STEP_FLOOR`, worst first
    (ties: the larger share): each with its step count, that count, and its median signed error
    (``sim / real - 1``). Why: a p95 is made of a few scenarios; a scenario whose median is near
    0 with many misses is measurement spread (host stalls, routing), one whose median is off is
    a regime the model does not follow. Scenarios with no step beyond the floor are left out."""
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(r["scenario"], []).append(model.predict_row(r) / r["target"] - 1)
    ranked = []
    for name, errs in by.items():
        beyond = sum(abs(e) > STEP_FLOOR for e in errs)
        if beyond:
            ranked.append((-beyond, -beyond / len(errs), name, len(errs), float(np.median(errs))))
    ranked.sort()
    return [
        {"scenario": name, "steps": n, "beyond_floor": -neg, "median_err": round(med, 4)}
        for neg, _, name, n, med in ranked[:WORST_SCENARIOS]
    ]


def launches_across_processes(by_proc: dict[int, list[float]]) -> list[float]:
    """One kind's launch times (seconds, ascending) from the launches of each engine process
    (``by_proc``: process -> launches). With fewer than two processes of `MIN_LAUNCHES` or more,
    all launches as measured. Else each process's launches over its own median, times the
    median of the processes' medians: the spread within a process (what makes a serving run's
    token gaps spread) from all of them, the level from each process once.

    Why not pooled as measured: the launch time is drawn per engine process (H100
    DeepSeek-V2-Lite's profiling run, one H100, two processes: eager 107 and 67 ms by the fit's
    attribution), and a serving run is one process. Pooled, the level leans to whichever process
    ran more scenarios (there 62 of 95 launches: a median of 97 ms), and the spread mixes two
    levels into a width no one process shows."""
    medians = process_medians(by_proc)
    if len(medians) < 2:
        return sorted(w for v in by_proc.values() for w in v)
    level = float(np.median(list(medians.values())))
    return sorted(level * w / m for p, m in medians.items() for w in by_proc[p])


def process_medians(by_proc: dict[int, list[float]]) -> dict[int, float]:
    """The median launch of each engine process with `MIN_LAUNCHES` launches or more, in
    process order (fewer are too thin a sample of a process's level)."""
    return {p: float(np.median(w)) for p, w in sorted(by_proc.items()) if len(w) >= MIN_LAUNCHES}


def sorted_quantile(values: list[float], u: float) -> float:
    """The ``u``-quantile (0 <= u <= 1) of ascending ``values``, bit for bit numpy's default
    (``np.quantile``, linear, its two-sided interpolation included), without its per-call
    overhead: the executor draws one per launch (`launch_quantile_s`)."""
    last = len(values) - 1
    v = last * u
    if v >= last:
        return values[-1]
    i = math.floor(v)
    g, a, b = v - i, values[i], values[i + 1]
    return b - (b - a) * (1 - g) if g >= 0.5 else a + (b - a) * g


def _abs_err_stats(errs: list[float]) -> dict:
    e = np.abs(np.array(errs))
    if not len(e):
        return {"steps": 0}
    return {
        "steps": len(e),
        "median": float(np.median(e)),
        "p95": float(np.percentile(e, 95)),
        "max": float(e.max()),
    }


def l1_fit(a: np.ndarray) -> np.ndarray:
    """``argmin_c sum_i |a_i . c - 1|`` over ``c >= 0``, solved as the dual linear program:
    ``max sum(y)`` over ``-1 <= y_i <= 1`` with ``a^T y <= 0``, whose constraints' multipliers
    are ``c``. Why the dual: the primal (residuals split into positive and negative parts) has
    ``2n`` variables and ``n`` equality rows, the dual ``n`` bounded variables and one row per
    coefficient; on a three-pass table (9,000 training steps) HiGHS solves it in 1.1 s against
    7 s for the primal (18 s built dense), to the same coefficients (within 1e-13 on every
    shipped table)."""
    n, k = a.shape
    res = linprog(-np.ones(n), A_ub=a.T, b_ub=np.zeros(k), bounds=(-1, 1), method="highs")
    if not res.success:
        raise ConfigError("<engine-steps table>", "steps", f"fit failed: {res.message}")
    return np.maximum(-res.ineqlin.marginals, 0.0)  # multipliers of <= rows are <= 0


def median_of_repeats(rows: list[dict]) -> list[dict]:
    """The usable rows of ``rows``, each with the median of its composition's usable targets
    (its ``group``, `profiles.vllm_table.group_repeats`) as its target and their count as
    ``samples``. A table recorded in one pass has one step per group: its rows come back as
    they are.

    Why: each pass times a step once, from the engine's output stamps, and a step of the same
    composition in a later pass is a second timing of it; the median of three is what a kernel
    bench reports. Every recorded step still counts once (a composition that no other pass
    repeated, as under random arrivals, keeps its one interval). Launch waits (`_fit_launch`)
    keep every interval: their spread is the host's, which the simulator draws from."""
    usable = [r for r in rows if _usable(r)]
    groups = _group_targets(usable)
    out = []
    for r in usable:
        targets = groups[r["group"]]
        if len(targets) == 1:
            out.append(r)
        else:
            out.append({**r, "target": median(targets), "samples": len(targets)})
    return out


def repeat_spread(rows: list[dict]) -> dict:
    """How far each timing of a composition timed three or more times (``group``) lies from
    their median, ``|t / median - 1|``: the measurement's own step-to-step noise, a floor no
    step model can go under on single intervals (H200 fp8: p95 1.7%; one H100: 17.5%)."""
    groups = _group_targets([r for r in rows if _usable(r)])
    return _abs_err_stats(
        [t / median(ts) - 1 for ts in groups.values() if len(ts) >= 3 for t in ts]
    )


def _group_targets(rows: list[dict]) -> dict[int, list[float]]:
    """The targets of ``rows`` by composition (``group``), in row order."""
    groups: dict[int, list[float]] = {}
    for r in rows:
        groups.setdefault(r["group"], []).append(r["target"])
    return groups


def _usable(r: dict) -> bool:
    """A step the fit and the held-out report can use: not planned during a profiling burst,
    and with a time of its own (see ``EngineStepModel._attribute``)."""
    return not r["burst"] and r["target"] is not None and r["target"] > 0


def is_engine_table(table_dir: str | Path) -> bool:
    """Whether the table in ``table_dir`` holds whole engine steps (``kind: engine_steps``);
    an unreadable ``meta.yaml`` is a ConfigError naming it."""
    meta = Path(table_dir) / "meta.yaml"
    return meta.is_file() and "kind: engine_steps" in read_text(meta, "table meta.yaml")


def _read_meta(table_dir: Path) -> dict:
    path = table_dir / "meta.yaml"
    meta = load_yaml_file(path, "table meta.yaml")
    for key in ("engine", "gpu", "model", "tp"):
        if not isinstance(meta, dict) or key not in meta:
            raise ConfigError(str(path), key, "missing (an engine-steps table's meta)")
    check_meta_keys(meta, str(path), TABLE_META)
    return meta


#: float columns of ``steps.csv`` (attention features count keys read per layer, fractional
#: for a model with sliding layers; and the measured time)
_FLOAT = ("prefill_attn", "decode_ctx", "dur_us")
#: integer columns (the rest, but for the scenario and split text)
_INT = tuple(c for c in STEP_COLUMNS if c not in ("scenario", "split", *_FLOAT))


def read_steps_csv(path: Path) -> list[dict]:
    """Rows of an engine-steps ``steps.csv``; a bad header or value names the file and line."""
    rows = []
    required = [c for c in STEP_COLUMNS if c not in OPTIONAL_COLUMNS]
    for line, raw in csv_records(path, "steps.csv table", required):
        if not raw.get("group"):
            raw["group"] = raw["step_id"]
        if not raw.get("proc"):
            raw["proc"] = 0
        try:
            r = {c: int(raw[c]) for c in _INT}
            r.update((c, float(raw[c])) for c in _FLOAT)
        except (TypeError, ValueError):
            raise ConfigError(str(path), f"line {line}", f"expected numbers, got {raw}") from None
        if raw["split"] not in ("train", "test") or r["dur_us"] <= 0:
            raise ConfigError(str(path), f"line {line}", "split must be train|test, dur_us > 0")
        r["scenario"], r["split"] = raw["scenario"], raw["split"]
        rows.append(r)
    return rows
