"""Build a ``Workload`` from the ``workload:`` section of an experiment YAML.

The schema is documented in ``workloads/README.md``. This module only reads and cross-checks the
config, then composes the pieces: a request source (trace rows or synthetic draws), an arrival
process, length distributions and limits.

Reproducibility contract: ``build_workload`` never draws from the ``rng`` it is given. It spawns
four independent child generators from it, always in this order, and uses each for one thing:

    arrivals, input lengths, output lengths, trace row order

So the same seed gives identical requests, and changing the output-length distribution does not
move arrival times or prompt lengths. Spawning advances ``rng``'s spawn counter: pass the run's
generator once (or a child of it), not one generator to several builds.

Invariants of the result: requests sorted by arrival; every length >= 1; every request the
source offered and the workload does not contain is counted in ``Workload.cuts``; ``info`` holds
only JSON types (str, int, float, bool, dict, list, None).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.cfg import Section
from simulator.errors import ConfigError
from workloads.arrivals import (
    PROCESSES,
    TooManyArrivals,
    repeat_arrivals,
    repeat_period,
    replay_arrivals,
    spread_quantized,
)
from workloads.lengths import LengthDist, parse_length_dist
from workloads.limits import Limits, apply_limits, parse_limits
from workloads.loaders import FORMATS, Trace, TraceFormatError, load_trace
from workloads.paths import resolve_file
from workloads.spec import RequestColumns, Workload

# A cap on generated requests, so that a typo (rate 1e6 for a day) fails fast instead of
# exhausting memory.
MAX_GENERATED = 10_000_000

STREAMS = ("arrivals", "input", "output", "order")

# Keys of workload.arrival and the processes that use them (for a precise "not used" error).
ARRIVAL_KEYS = {
    "rate_per_s": ("poisson", "gamma", "constant"),
    "cv": ("gamma",),
    "rate_scale": ("trace",),
}


@dataclass(frozen=True)
class TraceChoice:
    """A loaded trace plus how the YAML asked to use it."""

    text: str  # the path as written in the YAML (portable, goes into info)
    trace: Trace
    repeat: bool
    order: str  # "file" | "shuffle"
    zero_output: str  # "clamp" | "drop"
    spread_s: float


@dataclass(frozen=True)
class Replay:
    """Arrival process "trace": the trace's own timestamps, rate multiplied by rate_scale."""

    rate_scale: float
    name = "trace"

    def describe(self) -> dict:
        return {"arrival": "trace", "rate_scale": self.rate_scale}


def child_streams(rng: np.random.Generator, n: int) -> list[np.random.Generator]:
    """``n`` independent generators spawned from ``rng``'s seed sequence (no draws from rng)."""
    spawn = getattr(rng, "spawn", None)
    if spawn is not None:  # numpy >= 1.25
        return spawn(n)
    bit_generator = rng.bit_generator
    seeds = bit_generator._seed_seq.spawn(n)  # numpy 1.24
    return [np.random.Generator(type(bit_generator)(seed)) for seed in seeds]


def build_workload(sec: Section, rng: np.random.Generator, base_dir: Path) -> Workload:
    """The requests described by ``sec`` (the ``workload:`` mapping), drawn from ``rng``.

    ``base_dir`` is the folder of the experiment YAML; relative paths are resolved as described
    in ``workloads.paths``. Every bad value raises ``ConfigError`` naming the file and dotted key.
    """
    base_dir = Path(base_dir)
    trace = _parse_trace(sec.section("trace"), base_dir) if sec.has("trace") else None
    arrival = _parse_arrival(sec.section("arrival"), trace)
    input_dist, output_dist = _parse_lengths(sec, trace, base_dir)
    num_requests = sec.int("num_requests", None, min=1, max=MAX_GENERATED)
    limits = parse_limits(sec.section("limits", None))
    sec.done()
    _check_trace_use(sec, trace, arrival)

    streams = child_streams(rng, len(STREAMS))
    fresh = [g.bit_generator.state for g in streams]
    arrival_rng, input_rng, output_rng, order_rng = streams
    cuts: dict[str, int] = {}
    notes: dict = {}  # counts found on the way, appended to info at the end
    n, horizon = _request_count(sec, trace, num_requests, limits, cuts, notes)
    times = _arrival_times(sec, trace, arrival, n, horizon, arrival_rng)
    times, prompt, output, hashes = _lengths(
        trace, input_dist, output_dist, times, (input_rng, output_rng, order_rng), cuts, notes
    )
    times, prompt, output, hash_list = _within_limits(
        sec, limits, times, prompt, output, hashes, cuts
    )
    requests = RequestColumns(times, prompt, output, hash_list)
    info = _describe(trace, arrival, input_dist, output_dist, limits, times, prompt, output)
    info.update(notes)
    source = f"trace:{trace.text}" if trace else f"synthetic:{arrival.name}"
    drew = tuple(
        name
        for name, g, s in zip(STREAMS, streams, fresh, strict=True)
        if g.bit_generator.state != s
    )
    return Workload(requests=requests, source=source, cuts=cuts, info=info, random_draws=drew)


def _check_trace_use(sec: Section, trace, arrival) -> None:
    """Trace options that only make sense with one kind of arrival process."""
    trace_key = sec.key("trace")
    if trace is not None and trace.spread_s > 0 and not isinstance(arrival, Replay):
        raise ConfigError(
            sec.where,
            f"{trace_key}.spread_quantized_s",
            "only used with arrival.process: trace (it spreads replayed timestamps)",
        )
    if trace is not None and trace.order == "shuffle" and isinstance(arrival, Replay):
        raise ConfigError(
            sec.where,
            f"{trace_key}.order",
            "shuffle would pair the trace's timestamps with other rows' lengths; use it with a"
            " synthetic arrival process",
        )


def _arrival_times(sec: Section, trace, arrival, n, horizon, arrival_rng) -> np.ndarray:
    """Arrival times: ``n`` of them, or all up to the horizon of an endless source."""
    if isinstance(arrival, Replay):
        return _replay_times(sec, trace, arrival, n, horizon)
    try:
        if n is None:
            return arrival.times_until(arrival_rng, horizon, MAX_GENERATED)
        return arrival.times(arrival_rng, n)
    except TooManyArrivals as exc:
        raise ConfigError(sec.where, sec.key("limits.duration_s"), str(exc)) from None


def _lengths(trace, input_dist, output_dist, times, rngs, cuts: dict, notes: dict):
    """Prompt and output lengths (and prefix block ids) from the trace rows, then any synthetic
    overrides; a trace's zero-output rows are handled by `_zero_outputs` (which may drop rows,
    so the times come back too)."""
    input_rng, output_rng, order_rng = rngs
    n = len(times)
    prompt = output = hashes = None
    if trace is not None:
        rows = _row_indices(n, len(trace.trace), trace.order, order_rng)
        prompt = trace.trace.num_prompt_tokens[rows]
        output = trace.trace.num_output_tokens[rows]
        if trace.trace.hash_ids is not None:
            hashes = _cycled_hash_ids(trace.trace.hash_ids, rows, len(trace.trace))
    if input_dist is not None:
        prompt = input_dist.sample(input_rng, n)
    if output_dist is not None:
        output = output_dist.sample(output_rng, n)
    elif trace is not None:
        times, prompt, output, hashes = _zero_outputs(
            trace, times, prompt, output, hashes, cuts, notes
        )
    return times, prompt, output, hashes


def _within_limits(sec: Section, limits, times, prompt, output, hashes, cuts: dict):
    """The requests the limits keep (their cuts counted in ``cuts``); an empty result is an
    error. Invariant checked: arrivals sorted, every length >= 1."""
    index, limit_cuts = apply_limits(limits, times, prompt, output)
    cuts.update(limit_cuts)
    if len(index) == 0:
        raise ConfigError(
            sec.where, sec.path, f"no requests are left after the limits (cut: {cuts})"
        )
    times, prompt, output = times[index], prompt[index], output[index]
    hash_list = [hashes[i] for i in index.tolist()] if hashes is not None else None
    if np.any(np.diff(times) < 0) or prompt.min() < 1 or output.min() < 1:
        raise AssertionError("workload invariant broken: unsorted arrivals or a length < 1")
    return times, prompt, output, hash_list


# ---------------------------------------------------------------------------- config readers


def _parse_trace(sec: Section, base_dir: Path) -> TraceChoice:
    text, path = resolve_file(sec, "path", base_dir)
    fmt = sec.str("format", "auto", choices=("auto", *FORMATS))
    spread = sec.num("spread_quantized_s", 0.0, min=0)
    repeat = sec.bool("repeat", False)
    order = sec.str("order", "file", choices=("file", "shuffle"))
    zero_output = sec.str("zero_output", "clamp", choices=("clamp", "drop"))
    sec.done()
    try:
        trace = load_trace(path, fmt)
    except TraceFormatError as exc:
        raise sec.error("path", exc.one_line()) from None
    if spread > 0 and trace.arrival_s is None:
        raise sec.error("spread_quantized_s", f"the trace {text} has no timestamps to spread")
    return TraceChoice(text, trace, repeat, order, zero_output, spread)


def _parse_arrival(sec: Section, trace: TraceChoice | None):
    process = sec.str("process", choices=(*PROCESSES, "trace"))
    for name in sec.data:
        users = ARRIVAL_KEYS.get(name)
        if users is not None and process not in users:
            raise sec.error(name, f"not used by process {process} (only by {', '.join(users)})")
    if process == "trace":
        if trace is None:
            raise sec.error("process", "trace replay needs workload.trace (a timestamped trace)")
        if trace.trace.arrival_s is None:
            raise sec.error(
                "process",
                f"the trace {trace.text} ({trace.trace.format} format) has no timestamps; use a"
                " synthetic process (poisson, gamma, constant)",
            )
        out = Replay(sec.num("rate_scale", 1.0, min=0, strict_min=True))
    else:
        rate = sec.num("rate_per_s", min=0, strict_min=True)
        if not math.isfinite(rate):
            raise sec.error("rate_per_s", f"expected a finite rate, got {rate}")
        if process == "gamma":
            out = PROCESSES[process](rate, sec.num("cv", min=0, strict_min=True))
        else:
            out = PROCESSES[process](rate)
    sec.done()
    return out


def _parse_lengths(
    sec: Section, trace: TraceChoice | None, base_dir: Path
) -> tuple[LengthDist | None, LengthDist | None]:
    """Both distributions without a trace; with one, each is optional and replaces its column."""
    if not sec.has("lengths"):
        if trace is None:
            raise sec.error(
                "lengths", "required when there is no workload.trace (give input and output)"
            )
        return None, None
    lengths = sec.section("lengths")
    dists = []
    for name in ("input", "output"):
        if trace is None or lengths.has(name):
            dists.append(parse_length_dist(lengths.section(name), base_dir))
        else:
            dists.append(None)
    lengths.done()
    if trace is not None and dists[0] is not None and trace.trace.hash_ids is not None:
        raise lengths.error(
            "input",
            f"the trace {trace.text} has prefix hash_ids, which must cover its own prompt"
            " lengths; remove workload.lengths.input or use a trace without hash_ids",
        )
    return dists[0], dists[1]


# ---------------------------------------------------------------------------- composition


def _request_count(
    sec: Section,
    trace: TraceChoice | None,
    num_requests: int | None,
    limits: Limits,
    cuts: dict[str, int],
    notes: dict,
) -> tuple[int | None, float | None]:
    """How many requests to draw, or (None, horizon) to draw an endless source up to a time.

    A trace without ``repeat`` is a finite source: rows beyond ``num_requests`` are counted in
    ``cuts["num_requests"]``, and asking for more rows than it has takes them all and records
    the shortfall in ``info["num_requests_short"]``. Synthetic and repeated sources are endless.
    """
    finite_rows = len(trace.trace) if trace is not None and not trace.repeat else None
    if num_requests is not None:
        notes["num_requests_asked"] = num_requests
        if finite_rows is not None and num_requests > finite_rows:
            notes["num_requests_short"] = num_requests - finite_rows
            return finite_rows, None
        if finite_rows is not None and num_requests < finite_rows:
            cuts["num_requests"] = finite_rows - num_requests
        return num_requests, None
    if finite_rows is not None:
        return finite_rows, None
    if limits.duration_s is not None:
        return None, limits.duration_s
    if limits.max_requests is not None:
        return limits.max_requests, None
    raise sec.error(
        "num_requests",
        "required: the source never ends (synthetic or repeated trace); set num_requests,"
        " limits.duration_s or limits.max_requests",
    )


def _replay_times(
    sec: Section, trace: TraceChoice, replay: Replay, n: int | None, horizon: float | None
) -> np.ndarray:
    base = spread_quantized(trace.trace.arrival_s, trace.spread_s)
    if not trace.repeat:
        return replay_arrivals(base[:n], replay.rate_scale)
    try:
        period = repeat_period(base)
    except ValueError as exc:
        raise ConfigError(sec.where, sec.key("trace.repeat"), f"{trace.text}: {exc}") from None
    if n is None:  # endless: every cycle that starts before the horizon
        cycles = math.floor((horizon * replay.rate_scale - base[0]) / period) + 1
        n = max(cycles, 1) * len(base)
        if n > MAX_GENERATED:
            raise ConfigError(
                sec.where,
                sec.key("limits.duration_s"),
                f"repeating {trace.text} up to {horizon} s needs {n} requests, more than"
                f" {MAX_GENERATED}",
            )
        times = replay_arrivals(repeat_arrivals(base, n), replay.rate_scale)
        return times[: np.searchsorted(times, horizon, side="right")]
    return replay_arrivals(repeat_arrivals(base, n), replay.rate_scale)


def _row_indices(n: int, rows: int, order: str, rng: np.random.Generator) -> np.ndarray:
    """Trace rows for requests 0..n-1: file order, or a fresh permutation per pass (shuffle)."""
    passes = -(-n // rows)
    if order == "file":
        return np.arange(n) % rows
    return np.concatenate([rng.permutation(rows) for _ in range(passes)])[:n]


def _cycled_hash_ids(
    hash_ids: list[tuple[int, ...]], rows: np.ndarray, num_rows: int
) -> list[tuple[int, ...]]:
    """Block ids per request; pass k of a repeated trace shifts ids by k * (max id + 1).

    Why: a repeated pass stands for new users, so it must not hit the previous pass's KV blocks.
    """
    out = [hash_ids[i] for i in rows.tolist()]
    if len(rows) <= num_rows:
        return out
    offset = 1 + max((max(h) for h in hash_ids if h), default=-1)
    for k in range(num_rows, len(out)):
        shift = (k // num_rows) * offset
        out[k] = tuple(h + shift for h in out[k])
    return out


def _zero_outputs(trace, times, prompt, output, hashes, cuts, notes):
    """Trace rows with 0 output tokens: clamp to 1 (default) or drop; counted either way.

    Why not keep 0: a served request always produces at least its first token (TTFT is defined
    by it), and TPOT divides by output - 1.
    """
    zero = output == 0
    count = int(zero.sum())
    if trace.zero_output == "clamp":
        notes["zero_output_clamped"] = count
        return times, prompt, np.maximum(output, 1), hashes
    cuts["zero_output"] = count
    if count == 0:
        return times, prompt, output, hashes
    keep = np.flatnonzero(~zero)
    kept_hashes = [hashes[i] for i in keep] if hashes is not None else None
    return times[keep], prompt[keep], output[keep], kept_hashes


def _describe(trace, arrival, input_dist, output_dist, limits, times, prompt, output) -> dict:
    """``info`` for summary.json: the source, the process, the limits and realized statistics."""
    info: dict = {"source": "trace" if trace is not None else "synthetic"}
    if trace is not None:
        info.update(
            trace=trace.text,
            trace_format=trace.trace.format,
            trace_rows=len(trace.trace),
            trace_order=trace.order,
            repeat=trace.repeat,
            zero_output=trace.zero_output,
        )
        if trace.trace.num_reordered:
            info["trace_rows_reordered"] = trace.trace.num_reordered
        if trace.spread_s > 0:
            info["spread_quantized_s"] = trace.spread_s
        if trace.trace.hash_block_size is not None:
            info["hash_block_size"] = trace.trace.hash_block_size
    info.update(arrival.describe())
    info["input_lengths"] = input_dist.describe() if input_dist is not None else "trace"
    info["output_lengths"] = output_dist.describe() if output_dist is not None else "trace"
    info["limits"] = limits.describe()
    span = float(times[-1] - times[0])
    info.update(
        num_requests=len(times),
        mean_input_tokens=float(prompt.mean()),
        mean_output_tokens=float(output.mean()),
        max_input_tokens=int(prompt.max()),
        max_output_tokens=int(output.max()),
        first_arrival_s=float(times[0]),
        span_s=span,
        mean_rate_per_s=(len(times) - 1) / span if span > 0 else None,
    )
    return info
