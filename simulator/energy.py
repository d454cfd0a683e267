"""The energy of a run's engine steps: measured through a serving engine, or a labelled estimate.

Why a model per table: a GPU's power is not a constant. The profiler reads NVML's cumulative
energy counter while it times whole engine steps (``energy.csv`` beside an engine-steps table,
one row per profiling scenario), and the joules of a window of steps follow the work in it:

* **idle power** ``idle_w`` (the whole replica's, engine idle; from the table's ``meta.yaml``)
  is paid for all wall time, busy or not;
* **busy static power** ``a`` W: clocks and HBM up while a step runs, per busy second;
* **per-step fixed work** ``b`` J: the weights are read once a step whatever its batch;
* **per-token compute** ``c`` J per token (prefill tokens + decode sequences): the GEMMs;
* **per-KV-token memory traffic** ``d`` J per decode KV token read, and ``e`` J per prefill
  attention (query, key) pair;
* for a mixture of experts, **per-expert weight reads** ``f`` J per routed expert a step
  touches (`ExpertReads`: the expected distinct experts of its tokens, per MoE layer): a step's
  expert weights are read once per expert its tokens route to, so a small batch reads a few
  experts and a large one all of them. Without this term the fixed per-step cost is an average
  over batch sizes: Qwen3-30B-A3B's held-out scenarios missed by 8.6% / 20.5% (median / p95),
  +33% on 8-sequence decodes and -20% on 96-128-sequence ones; with it 2.1% / 7.3%.

``joules(window) = idle_w x window_s + a x busy_s + b x steps + c x tokens + d x decode_ctx
+ e x prefill_attn [+ f x expert_reads]``, with ``a .. f >= 0`` (`scipy.optimize.nnls`),
fitted on the ``train`` scenarios only, on relative error (each row divided by its joules, so
long windows do not outvote short ones). NVML's counter refreshes about every 0.1 s, so windows
shorter than ``MIN_WINDOW_S`` carry mostly quantization and are left out of the fit and of the
report. The held-out ``test`` scenarios give the published error (`MeasuredStepEnergy.heldout`).

Tables without readings, and the roofline / profiled / constant models, fall back to
`TdpStepEnergy`: every busy second at the GPU's TDP x TP, idle not counted (``source:
tdp_estimate``, an upper-bound-ish guess, never presented as measured). A GPU without a
``tdp_w`` (a user-defined one) gets `UnknownEnergy`: the summary says null and why.

Invariants: no per-step Python; a run's energy is computed once, from the run's step columns
(`step_totals`). A P/D run's two pools share one latency model (`simulator.disagg`), hence one
energy model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from simulator.errors import ConfigError
from simulator.files import csv_records
from simulator.served import expected_experts_touched

ENERGY_COLUMNS = (
    "scenario", "split", "window_s", "joules", "busy_s", "steps", "tokens", "decode_ctx",
    "prefill_attn",
)  # fmt: skip
#: the busy terms of the law, in coefficient order (a, b, c, d, e)
BUSY_TERMS = ("busy_s", "steps", "tokens", "decode_ctx", "prefill_attn")
#: a mixture of experts' sixth term (f): expected routed experts touched, summed over steps; an
#: ``energy.csv`` column only where the table's meta.yaml says how it was counted
#: (``energy.experts``)
EXPERT_TERM = "expert_reads"
#: each term's coefficient as outputs name it
COEFFICIENT_NAMES = {
    "busy_s": "busy_w", "steps": "per_step_j", "tokens": "per_token_j",
    "decode_ctx": "per_decode_ctx_j", "prefill_attn": "per_prefill_attn_j",
    EXPERT_TERM: "per_expert_read_j",
}  # fmt: skip
#: shortest window the fit and the report use: NVML's counter refreshes about every 0.1 s
MIN_WINDOW_S = 0.5
#: electricity price when ``hardware.usd_per_kwh`` is not given: an ASSUMPTION (a typical
#: US industrial / data-centre rate), not a quote
DEFAULT_USD_PER_KWH = 0.10
JOULES_PER_KWH = 3.6e6


@dataclass(frozen=True)
class ExpertReads:
    """How a mixture of experts' expert reads are counted: a step of ``T`` tokens (prefill
    tokens + decode sequences) touches `simulator.served.expected_experts_touched` routed
    experts per MoE layer, ``E (1 - (1 - k/E)^T)`` under uniform routing, fewer under
    ``routing_skew``. One instance serves the table's build (`profiles.vllm_table`) and a run's
    totals (`step_totals`), so the fit and the prediction count alike."""

    num_experts: int
    top_k: int
    routing_skew: float = 0.0

    def per_step(self, tokens: np.ndarray) -> np.ndarray:
        """Expected experts touched by each step of ``tokens`` tokens (0 for 0): the one
        formula, `expected_experts_touched`, once per distinct token count (a run has at most
        the token budget's worth of them, however many steps)."""
        counts, where = np.unique(np.asarray(tokens, dtype=np.int64), return_inverse=True)
        e, k, skew = self.num_experts, self.top_k, self.routing_skew
        touched = [expected_experts_touched(e, k, int(t), skew) for t in counts]
        return np.array(touched, dtype=float)[where]

    def describe(self) -> dict:
        return {"num_experts": self.num_experts, "top_k": self.top_k,
                "routing_skew": self.routing_skew}  # fmt: skip


def step_totals(steps: dict, experts: ExpertReads | None = None) -> dict[str, float]:
    """The law's busy terms summed over a run's step columns (`metrics.step_arrays`): busy
    seconds, steps, tokens (prefill tokens + decode sequences), decode KV tokens read and
    prefill attention pairs, and with ``experts`` the expert reads. Vectorized: one numpy pass
    per column."""
    dur = steps["duration_s"]
    out = {
        "busy_s": float(dur.sum()),
        "steps": float(dur.size),
        "tokens": float(steps["prefill_tokens"].sum() + steps["decode_seqs"].sum()),
        "decode_ctx": float(steps["decode_ctx"].sum()),
        "prefill_attn": float(steps["prefill_attn"].sum()),
    }
    if experts is not None:
        tokens = steps["prefill_tokens"] + steps["decode_seqs"]
        out[EXPERT_TERM] = float(experts.per_step(tokens).sum())
    return out


class MeasuredStepEnergy:
    """The law of the module docstring, fitted on one table's ``energy.csv``.

    ``rows``: the csv's rows (`read_energy_csv`); ``idle_w``: the whole replica's idle power;
    ``gpus``: the GPUs it was measured over (the table's TP); ``source``: the table's name as
    outputs show it; ``experts``: how the rows' ``expert_reads`` were counted (a mixture of
    experts' table), which adds that term. ConfigError (naming ``where``) when fewer usable
    training windows than coefficients, or when rows and ``experts`` disagree on the term."""

    kind = "measured"

    def __init__(
        self, rows: list[dict], idle_w: float, gpus: int, source: str, where: str, copies: int = 1,
        experts: ExpertReads | None = None,
    ):  # fmt: skip
        self.idle_w, self.gpus, self.source = float(idle_w), int(gpus), source
        #: a replica's joules are this many times the fitted ones: ``tp`` for a table of one
        #: GPU's shard of a TP layout (every GPU of it runs the same shard), else 1
        self.copies = int(copies)
        self.rows, self.experts = rows, experts
        self.terms = BUSY_TERMS + ((EXPERT_TERM,) if experts is not None else ())
        counted = bool(rows) and all(EXPERT_TERM in r for r in rows)
        if counted != (experts is not None):
            why = (
                "an expert_reads column without meta.yaml energy.experts (how it was counted)"
                if counted
                else "no expert_reads column, but meta.yaml has energy.experts"
            )
            raise ConfigError(where, EXPERT_TERM, why)
        train = _usable(rows, "train")
        if len(train) < len(self.terms):
            need = f"the energy fit needs {len(self.terms)}"
            raise ConfigError(
                where,
                "split",
                f"{len(train)} train scenarios with window_s >= {MIN_WINDOW_S} s; {need}",
            )
        x, joules, window = _arrays(train, self.terms)
        scale = x.max(axis=0)
        scale[scale == 0] = 1.0
        a = x / scale / joules[:, None]
        b = (joules - self.idle_w * window) / joules
        coef, _ = nnls(a, b)
        self.coef = coef / scale
        self.train_scenarios = len(train)

    def predict(self, x: np.ndarray, window_s: np.ndarray) -> np.ndarray:
        """Joules of windows with busy terms ``x`` (rows in ``self.terms`` order)."""
        return self.idle_w * window_s + x @ self.coef

    def joules(self, totals: dict, replica_s: float) -> dict:
        """Idle and busy joules of a run: idle over ``replica_s`` (wall time x replicas), busy
        from its step totals (`step_totals`)."""
        busy = float(np.dot(self.coef, [totals[k] for k in self.terms]))
        # x 1 for a whole engine's table: the same floats (multiplying by 1 is exact)
        return {"idle": self.copies * (self.idle_w * replica_s), "busy": self.copies * busy}

    def heldout(self) -> dict:
        """|relative error| of joules on the held-out scenarios (window_s >= MIN_WINDOW_S)."""
        test = _usable(self.rows, "test")
        if not test:
            return {"scenarios": 0}
        x, joules, window = _arrays(test, self.terms)
        err = np.abs(self.predict(x, window) / joules - 1)
        return {
            "scenarios": len(test),
            "median": float(np.median(err)),
            "p95": float(np.percentile(err, 95)),
            "max": float(err.max()),
        }

    def describe(self) -> dict:
        return {
            "idle_w": self.idle_w,
            "gpus": self.gpus,
            **({"replica_joules": f"{self.copies} x one GPU's (a shard table)"}
               if self.copies != 1 else {}),
            "coefficients": dict(zip(
                (COEFFICIENT_NAMES[t] for t in self.terms), map(float, self.coef), strict=True)),
            **({"experts": self.experts.describe()} if self.experts is not None else {}),
            "train_scenarios": self.train_scenarios,
            "heldout": self.heldout(),
        }  # fmt: skip


@dataclass(frozen=True)
class TdpStepEnergy:
    """An estimate, not a measurement: every busy second of a replica at ``tdp_w x gpus``,
    idle time not counted. ``why``: why no measured model applies (said in the summary)."""

    tdp_w: float
    gpus: int
    why: str
    kind = "tdp_estimate"
    source = "tdp_estimate"

    def joules(self, totals: dict, replica_s: float) -> dict:
        return {"idle": 0.0, "busy": self.tdp_w * self.gpus * totals["busy_s"]}

    def describe(self) -> dict:
        note = f"estimate: busy time x TDP x GPUs, idle not counted; {self.why}"
        return {"tdp_w": self.tdp_w, "gpus": self.gpus, "note": note}


@dataclass(frozen=True)
class UnknownEnergy:
    """No measured model and no TDP to estimate from: energy is reported as null, with why."""

    why: str
    kind = "unknown"
    source = "unknown"


def energy_model(latency, gpu, tp: int):
    """The energy model of a run: the latency model's own (``latency.energy``, set by
    `EngineStepModel` when its table has readings), else a TDP estimate from ``gpu.tdp_w``,
    else unknown. The reason for a fallback comes from ``latency.energy_note`` when given."""
    measured = getattr(latency, "energy", None)
    if measured is not None:
        return measured
    why = getattr(latency, "energy_note", None) or (
        f"the {getattr(latency, 'name', 'latency')} model measures no energy"
    )
    if getattr(gpu, "tdp_w", None) is None:
        return UnknownEnergy(f"{why}, and GPU {gpu.name} has no tdp_w to estimate from "
                             "(set hardware.gpu.tdp_w)")  # fmt: skip
    return TdpStepEnergy(gpu.tdp_w, tp, why)


def energy_summary(model, steps: dict, *, duration_s: float, replicas: int, tp: int,
                   output_tokens: int, tokens: int, usd_per_kwh: float,
                   tdp_w: float | None = None) -> dict:  # fmt: skip
    """summary.json's ``energy`` section: the whole run's joules (all replicas; idle included
    for measured tables), average power per replica and per GPU, joules per output token, and
    the energy's cost at ``usd_per_kwh`` (per million tokens, input + output, as ``cost``).
    A measured model whose average power per GPU comes out above the GPU's TDP (``tdp_w``)
    gets a ``warning``: no board averages more than its power limit, so the linear fit is
    extrapolating past the scenarios it was fitted on (seen: 759 W on a 700 W H200, a MoE
    table whose scenarios drew at most 702 W)."""
    out = {"source": model.source, "kind": model.kind, "usd_per_kwh": usd_per_kwh}
    if isinstance(model, UnknownEnergy):
        nulls = ("joules", "idle_joules", "busy_joules", "avg_power_w", "joules_per_output_token",
                 "usd", "usd_per_million_tokens")  # fmt: skip
        return {**out, **dict.fromkeys(nulls), "reason": model.why}
    replica_s = duration_s * replicas
    parts = model.joules(step_totals(steps, getattr(model, "experts", None)), replica_s)
    total = parts["idle"] + parts["busy"]
    usd = total / JOULES_PER_KWH * usd_per_kwh
    per_replica = total / replica_s if replica_s > 0 else 0.0
    if model.kind == "measured" and tdp_w and per_replica / tp > tdp_w:
        out["warning"] = (
            f"average power {per_replica / tp:.0f} W per GPU exceeds the GPU's TDP ({tdp_w:.0f} "
            f"W): the energy model of {model.source} extrapolates beyond its measured scenarios; "
            "joules are an overestimate"
        )
    return {
        **out,
        "joules": total,
        "idle_joules": parts["idle"],
        "busy_joules": parts["busy"],
        "avg_power_w": {"per_replica": per_replica, "per_gpu": per_replica / tp},
        "joules_per_output_token": total / output_tokens if output_tokens else None,
        "usd": usd,
        "usd_per_million_tokens": usd / (tokens / 1e6) if tokens else None,
        "model": model.describe(),
    }


# ------------------------------------------------------------------------- a table's readings


def table_energy(table_dir: Path, meta: dict, source: str, tp: int):
    """(``MeasuredStepEnergy``, None) for an engine-steps table with readings (``energy.csv``
    and ``meta.yaml``'s ``energy``), else (None, why not). A table with one but not the other,
    or bad values, is a ConfigError naming the file."""
    meta_path, csv_path = str(table_dir / "meta.yaml"), table_dir / "energy.csv"
    info = meta.get("energy")
    if info is None:
        why = "no meta.yaml energy" + (" (energy.csv is not used without it)"
                                        if csv_path.is_file() else "")  # fmt: skip
        return None, f"the table {source} has no power readings ({why})"
    if not isinstance(info, dict):
        raise ConfigError(meta_path, "energy", f"expected a mapping, got {info!r}")
    idle_w, gpus = info.get("idle_w"), info.get("gpus")
    if not _number(idle_w) or idle_w < 0:
        raise ConfigError(meta_path, "energy.idle_w", f"expected a number >= 0, got {idle_w!r}")
    # a shard table (`simulator.latency.shard`) read one GPU: the replica is tp of them
    want = 1 if meta.get("shard") else tp
    if isinstance(gpus, bool) or gpus != want:
        why = "one GPU's shard" if meta.get("shard") else "joules are the whole replica's"
        raise ConfigError(meta_path, "energy.gpus", f"expected {want} (the table's tp {tp}; "
                          f"{why}), got {gpus!r}")  # fmt: skip
    if not csv_path.is_file():
        raise ConfigError(str(csv_path), "file", "missing: meta.yaml has energy readings")
    rows = read_energy_csv(csv_path)
    copies = tp // want
    experts = _expert_reads(info.get("experts"), meta_path)
    return MeasuredStepEnergy(rows, idle_w, gpus, source, str(csv_path), copies, experts), None


def _expert_reads(info, meta_path: str) -> ExpertReads | None:
    """meta.yaml's ``energy.experts`` (how a mixture of experts' ``expert_reads`` column was
    counted), or None where absent; a bad value is a ConfigError naming the field."""
    if info is None:
        return None
    key = "energy.experts"
    if not isinstance(info, dict) or set(info) != {"num_experts", "top_k", "routing_skew"}:
        want = "expected num_experts, top_k, routing_skew"
        raise ConfigError(meta_path, key, f"{want}; got {info!r}")
    e, k, skew = info["num_experts"], info["top_k"], info["routing_skew"]
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (e, k))
    if not (ints and 0 < k <= e and _number(skew) and skew >= 0):
        raise ConfigError(meta_path, key, f"expected 0 < top_k <= num_experts and routing_skew "
                          f">= 0, got {info!r}")  # fmt: skip
    return ExpertReads(e, k, float(skew))


def read_energy_csv(path: Path) -> list[dict]:
    """Rows of an ``energy.csv``; a bad header or value names the file and line."""
    rows = []
    for line, raw in csv_records(path, "energy.csv table", ENERGY_COLUMNS):
        cols = ENERGY_COLUMNS[2:] + ((EXPERT_TERM,) if EXPERT_TERM in raw else ())
        try:
            r = {c: float(raw[c]) for c in cols}
        except (TypeError, ValueError):
            raise ConfigError(str(path), f"line {line}", f"expected numbers, got {raw}") from None
        bad = [c for c, v in r.items() if not (math.isfinite(v) and v >= 0)]
        if raw["split"] not in ("train", "test") or bad:
            why = f"split must be train|test and numbers finite >= 0 ({bad})"
            raise ConfigError(str(path), f"line {line}", why)
        r["scenario"], r["split"] = raw["scenario"], raw["split"]
        rows.append(r)
    return rows


def _usable(rows: list[dict], split: str) -> list[dict]:
    return [r for r in rows if r["split"] == split and r["window_s"] >= MIN_WINDOW_S
            and r["joules"] > 0]  # fmt: skip


def _arrays(rows: list[dict], terms: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.array([[r[k] for k in terms] for r in rows], dtype=float)
    return x, np.array([r["joules"] for r in rows]), np.array([r["window_s"] for r in rows])


def _number(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
