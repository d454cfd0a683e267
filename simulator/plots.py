"""Figures from saved results (the simulator never plots; this only reads result folders).

`plot_results(folder, out)` takes a sweep folder (with ``index.csv``) or a run folder (or a folder
of ``seedN`` runs) and writes each figure as PNG and SVG:

* ``ttft_vs_rate``, ``tpot_vs_rate``: p50 / p95 / p99 against the arrival rate, one line per
  combination of the other swept keys (e.g. per policy);
* ``goodput_vs_rate``: goodput and SLO attainment against the rate;
* ``latency_cdf``: TTFT and TPOT CDFs of every line at one rate;
* ``timeseries``: KV-cache use and batch size over time of one run (from ``steps.csv``).

With several seeds a line is their mean and the band a 95% t-interval over seeds. The x axis is
``workload.arrival.rate_per_s`` (or ``rate_scale`` for trace replay) when swept, else the first
numeric swept key. Titles name the model, GPU, TP and latency model from the runs' config.yaml.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import Formatter, FuncFormatter
from scipy import stats

from simulator.collect import (
    STEP_COLUMNS,
    describe_setup,
    load_config,
    load_index,
    read_results_csv,
    seed_runs,
)
from simulator.errors import ConfigError
from simulator.files import check_out_dir
from simulator.sweeprun import INDEX_METRICS

_PLAIN = FuncFormatter(lambda v, _: f"{v:g}")


class _MinorLog(Formatter):
    """Minor log ticks: label 2x and 5x, or every tick when the view spans < 4x (else a narrow
    axis shows no number at all)."""

    def __call__(self, v, pos=None):
        lo, hi = sorted(self.axis.get_view_interval()) if self.axis else (1.0, 10.0)
        if (lo > 0 and hi / lo < 4) or f"{v:g}"[0] in "25":
            return f"{v:g}"
        return ""


RATE_KEYS = ("workload.arrival.rate_per_s", "workload.arrival.rate_scale")
X_LABELS = {
    "workload.arrival.rate_per_s": "arrival rate (requests/s)",
    "workload.arrival.rate_scale": "trace rate scale (x original rate)",
}


def plot_results(folder: Path, out: Path, at_rate: float | None = None, run=None) -> list[Path]:
    folder, out = Path(folder), check_out_dir(out)
    index = load_index(folder)
    written: list[Path] = []
    if index is not None:
        index = index[index["status"] == "done"]
        if index.empty:
            raise ConfigError(str(folder), "index.csv", "no finished runs to plot")
        _check_metrics(index, folder / "index.csv")
        sweep = Sweep(folder, index)
        title = sweep.title()
        if sweep.x is not None:
            written += _save(_vs_rate(sweep, "ttft", "TTFT", title), out / "ttft_vs_rate")
            written += _save(_vs_rate(sweep, "tpot", "TPOT", title), out / "tpot_vs_rate")
            written += _save(_goodput(sweep, title), out / "goodput_vs_rate")
        cdf_runs, at = sweep.runs_at(at_rate)
        written += _save(_cdfs(cdf_runs, title, at, sweep.x_label), out / "latency_cdf")
        ts_run = Path(run) if run else sweep.busiest_run()
    else:
        runs = seed_runs(folder)
        if not runs:
            raise ConfigError(str(folder), "", "neither a sweep folder (index.csv) nor a run")
        first = runs[min(runs)]
        title = _title(first)
        written += _save(_cdfs({folder.name: first}, title, None, None), out / "latency_cdf")
        ts_run = Path(run) if run else first
    written += _save(_timeseries(ts_run, _title(ts_run)), out / "timeseries")
    return written


def _check_metrics(index: pd.DataFrame, path: Path) -> None:
    """The metric columns `servesim sweep` writes are there and numeric (the plots read them)."""
    for metric in INDEX_METRICS:
        if metric not in index.columns:
            why = "required column is missing (servesim sweep writes it; was the file edited?)"
            raise ConfigError(str(path), metric, why)
        if not pd.api.types.is_numeric_dtype(index[metric]):
            raise ConfigError(str(path), metric, "expected numbers in this column")


class Sweep:
    """An index.csv seen as lines (label) x rates (x) x seeds."""

    def __init__(self, folder: Path, index: pd.DataFrame):
        self.folder, self.df = folder, index.copy()
        fixed = {"point", "folder", "seed", "status", "resumed", "config_hash", "error"}
        swept = [c for c in index.columns if c not in fixed and c not in INDEX_METRICS]
        self._swept = swept
        rate = [k for k in RATE_KEYS if k in swept]
        numeric = [c for c in swept if pd.api.types.is_numeric_dtype(index[c])]
        self.x = rate[0] if rate else (numeric[0] if numeric else None)
        self.x_label = X_LABELS.get(self.x, self.x.split(".")[-1] if self.x else None)
        self.x_what = "load" if self.x in RATE_KEYS else self.x_label
        self._others = others = [c for c in swept if c != self.x]
        if others:
            self.df["label"] = [_label(r, others) for _, r in self.df.iterrows()]
        else:
            self.df["label"] = index["point"].fillna("").astype(str) if self.x is None else "run"
        self.labels = list(dict.fromkeys(self.df["label"]))
        self._name_lines_by_setup()
        self.nseeds = int(self.df.groupby(["label"] + ([self.x] if self.x else []))["seed"]
                          .nunique().max())  # fmt: skip

    def _name_lines_by_setup(self) -> None:
        """When lines differ in model or latency model (a swept model, or precisions served
        from different tables), each line's label names its own and the title says "per line":
        the first run's would otherwise be printed as everybody's. Other swept values stay in
        the label, in parentheses."""
        first = {lb: self.folder / self.df[self.df["label"] == lb]["folder"].iloc[0]
                 for lb in self.labels}  # fmt: skip
        setups = {lb: describe_setup(run) for lb, run in first.items()}
        self.per_line = [k for k in ("model", "latency")
                         if len({s[k] for s in setups.values()}) > 1]  # fmt: skip
        if not self.per_line:
            return
        # the swept values the name states (a whole model swept) are not repeated after it
        rest = [c for c in self._others if not ("model" in self.per_line and c in NAMED_BY_MODEL)]
        rename = {}
        for lb in self.labels:
            named = " / ".join(setups[lb][k] for k in self.per_line)
            row = self.df[self.df["label"] == lb].iloc[0]
            rename[lb] = f"{named} ({_label(row, rest, pairs=True)})" if rest else named
        self.df["label"] = self.df["label"].map(rename)
        self.labels = [rename[lb] for lb in self.labels]

    def title(self) -> str:
        name = load_config(self.folder / self.df["folder"].iloc[0]).get("name", self.folder.name)
        return f"{name}: {_title(self.folder / self.df['folder'].iloc[0], self.per_line)}"

    def line(self, label: str, metric: str):
        """x values, mean, band low, band high of ``metric`` for one line."""
        d = self.df[self.df["label"] == label]
        g = d.groupby(self.x)[metric]
        xs = np.array(sorted(g.groups))
        mean = np.array([g.get_group(x).mean() for x in xs], dtype=float)
        lo, hi = mean.copy(), mean.copy()
        for i, x in enumerate(xs):
            v = g.get_group(x).dropna().to_numpy(dtype=float)
            if v.size > 1:
                half = stats.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size)
                lo[i], hi[i] = v.mean() - half, v.mean() + half
        return xs, mean, lo, hi

    def runs_at(self, at_rate):
        """{label: run folder} of the first seed at the rate nearest ``at_rate`` (or middle)."""
        d = self.df
        at = None
        if self.x is not None:
            xs = np.array(sorted(d[self.x].unique()), dtype=float)
            at = xs[len(xs) // 2] if at_rate is None else xs[np.abs(xs - at_rate).argmin()]
            d = d[d[self.x] == at]
        d = d.sort_values("seed").drop_duplicates("label")
        return {r["label"]: self.folder / r["folder"] for _, r in d.iterrows()}, at

    def busiest_run(self) -> Path:
        d = self.df
        if self.x is not None:
            d = d[d[self.x] == d[self.x].max()]
        return self.folder / d.sort_values("seed")["folder"].iloc[0]


#: swept keys whose value a line's model name (`describe_setup`) already states
NAMED_BY_MODEL = ("model", "model.base")
#: a legend with a label longer than this, or with more lines, goes below the figure's axes
LEGEND_INSIDE_CHARS, LEGEND_INSIDE_LINES = 40, 6


def _label(row, columns: list[str], pairs: bool = False) -> str:
    """A line's label from its swept values: the value alone when one key is swept (unless
    ``pairs``), else ``key=value`` pairs (the key's last dotted part)."""
    if len(columns) == 1 and not pairs:
        return _show(row[columns[0]])
    return ", ".join(f"{c.split('.')[-1]}={_show(row[c])}" for c in columns)


def _legend(fig: Figure, ax, **kw) -> None:
    """``ax``'s legend inside it, or below the figure's axes when its labels are long or many
    (inside, a long legend covers the lines it names)."""
    handles, labels = ax.get_legend_handles_labels()
    if len(labels) > LEGEND_INSIDE_LINES or max(map(len, labels), default=0) > LEGEND_INSIDE_CHARS:
        fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=8, **kw)
    else:
        ax.legend(fontsize=8, **kw)


def _show(value) -> str:
    """A legend text for a swept value; mappings (JSON in index.csv) as ``k: v`` pairs."""
    text = str(value)
    if text.startswith("{"):
        try:
            return " ".join(_flat(json.loads(text)))
        except json.JSONDecodeError:
            return text
    return text


def _flat(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out += _flat(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}={v}")
    return out


def _title(run_dir: Path, per_line=()) -> str:
    """Model, GPU, TP, replicas and latency model of a run; a field named in ``per_line``
    differs between a figure's lines, which name their own, so the title says so instead."""
    s = describe_setup(run_dir)
    if "model" in per_line:
        s["model"] = "models per line"
    if "latency" in per_line:
        s["latency"] = "per line"
    reps = f" x{s['replicas']} replicas" if s["replicas"] and s["replicas"] > 1 else ""
    return f"{s['model']} on {s['gpu']} (TP{s['tp']}){reps}, latency model: {s['latency']}"


def _band_note(sweep: Sweep) -> str:
    return f"mean of {sweep.nseeds} seeds, band: 95% CI" if sweep.nseeds > 1 else "one seed"


def _plot_lines(ax, sweep: Sweep, metric: str, scale: float = 1.0, log: bool = False) -> None:
    for label in sweep.labels:
        xs, mean, lo, hi = sweep.line(label, metric)
        (ln,) = ax.plot(xs, mean * scale, marker="o", ms=4, label=label)
        if sweep.nseeds > 1:
            lo = np.maximum(lo, mean * 0.05) if log else np.maximum(lo, 0)  # no negative band
            ax.fill_between(xs, lo * scale, hi * scale, color=ln.get_color(), alpha=0.2, lw=0)
    ax.grid(True, alpha=0.3)
    ax.set_xlabel(sweep.x_label)
    xs = sweep.df[sweep.x].to_numpy(dtype=float)
    if sweep.x not in RATE_KEYS and xs.min() > 0 and xs.max() / xs.min() > 20:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(_PLAIN)
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(_PLAIN)
        ax.yaxis.set_minor_formatter(_MinorLog())


def _slo(sweep: Sweep, key: str):
    cfg = load_config(sweep.folder / sweep.df["folder"].iloc[0])
    v = (cfg.get("slo") or {}).get(key)
    return v


def _vs_rate(sweep: Sweep, lat: str, name: str, title: str) -> Figure:
    fig = Figure(figsize=(13, 4.2), layout="constrained")
    axes = fig.subplots(1, 3, sharex=True)
    slo_ms = _slo(sweep, f"{lat}_ms")
    for ax, p in zip(axes, ("p50", "p95", "p99"), strict=True):
        _plot_lines(ax, sweep, f"{lat}_{p}_s", 1000.0, log=True)
        if slo_ms:
            ax.axhline(slo_ms, color="k", ls="--", lw=1, label=f"SLO {slo_ms:g} ms")
        ax.set_ylabel(f"{p} {name} (ms)")
        ax.set_title(f"{p} {name}")
    _legend(fig, axes[0], title=_band_note(sweep), title_fontsize=8)
    fig.suptitle(f"{name} vs {sweep.x_what} - {title}", fontsize=10)
    return fig


def _goodput(sweep: Sweep, title: str) -> Figure:
    fig = Figure(figsize=(10, 4.2), layout="constrained")
    a1, a2 = fig.subplots(1, 2, sharex=True)
    _plot_lines(a1, sweep, "goodput_rps")
    if sweep.x == "workload.arrival.rate_per_s":
        xs = np.array(sorted(sweep.df[sweep.x].unique()), dtype=float)
        a1.plot(xs, xs, color="gray", ls=":", lw=1, label="offered load")
    a1.set_ylabel("goodput (requests/s meeting all SLOs)")
    a1.set_title("goodput")
    _plot_lines(a2, sweep, "slo_attainment", 100.0)
    a2.set_ylabel("SLO attainment (% of requests)")
    a2.set_ylim(-3, 103)
    a2.set_title("SLO attainment")
    ttft, tpot = _slo(sweep, "ttft_ms"), _slo(sweep, "tpot_ms")
    slo = ", ".join(f"{n} <= {v:g} ms" for n, v in (("TTFT", ttft), ("TPOT", tpot)) if v)
    _legend(fig, a1, title=_band_note(sweep), title_fontsize=8)
    fig.suptitle(f"goodput vs {sweep.x_what} (SLO: {slo or 'none set'})\n{title}", fontsize=10)
    return fig


def _cdfs(runs: dict, title: str, at, x_label) -> Figure:
    fig = Figure(figsize=(10, 4.2), layout="constrained")
    axes = fig.subplots(1, 2)
    for label, run in runs.items():
        req = read_results_csv(Path(run) / "requests.csv", ("status", "ttft_s", "tpot_s"),
                               ("ttft_s", "tpot_s"))  # fmt: skip
        req = req[req["status"] == "finished"]
        for ax, col in zip(axes, ("ttft_s", "tpot_s"), strict=True):
            v = np.sort(req[col].dropna().to_numpy() * 1000.0)
            if v.size:
                ax.plot(v, np.arange(1, v.size + 1) / v.size, label=label)
    for ax, name in zip(axes, ("TTFT", "TPOT"), strict=True):
        ax.set_xscale("log")
        ax.set_xlabel(f"{name} (ms, log scale)")
        ax.set_ylabel("fraction of finished requests")
        ax.set_title(f"{name} CDF")
        ax.grid(True, which="both", alpha=0.3)
        for q in (0.5, 0.95, 0.99):
            ax.axhline(q, color="gray", lw=0.6, ls=":")
    _legend(fig, axes[0])
    where = f" at {x_label} = {at:g}" if at is not None else ""
    fig.suptitle(f"latency CDFs{where} - {title}", fontsize=10)
    return fig


def _timeseries(run: Path, title: str, bins: int = 400) -> Figure:
    steps = read_results_csv(Path(run) / "steps.csv", STEP_COLUMNS, STEP_COLUMNS, STEP_COLUMNS)
    cfg = load_config(run)
    num_blocks = (cfg.get("kv_cache") or {}).get("num_blocks") or steps["kv_blocks_used"].max()
    fig = Figure(figsize=(10, 5.5), layout="constrained")
    a1, a2 = fig.subplots(2, 1, sharex=True)
    replicas = sorted(steps["replica"].unique())[:8]
    for rep in replicas:
        s = steps[steps["replica"] == rep]
        lab = f"replica {rep}" if len(replicas) > 1 else None
        t, kv = _binned(s, s["kv_blocks_used"] / max(num_blocks, 1) * 100.0, bins)
        a1.plot(t, kv, lw=1, label=lab)
        t, b = _binned(s, s["prefill_seqs"] + s["decode_seqs"], bins)
        a2.plot(t, b, lw=1, label=lab)
    a1.set_ylabel("KV cache in use (% of blocks)")
    a2.set_ylabel("batch size (sequences/step)")
    a2.set_xlabel("simulated time (s)")
    for ax in (a1, a2):
        ax.grid(True, alpha=0.3)
    if len(replicas) > 1:
        a1.legend(fontsize=8, ncol=4)
    fig.suptitle(f"{Path(run).parent.name}/{Path(run).name} over time (time-weighted means of "
                 f"{bins} bins)\n{title}", fontsize=9)  # fmt: skip
    return fig


def _binned(steps: pd.DataFrame, values: pd.Series, bins: int):
    """Time-weighted mean of a per-step value in equal time bins (idle time not counted)."""
    if steps.empty:
        return np.zeros(0), np.zeros(0)
    t0, t1 = steps["start_s"].min(), (steps["start_s"] + steps["duration_s"]).max()
    edges = np.linspace(t0, t1, bins + 1)
    idx = np.clip(
        np.searchsorted(edges, steps["start_s"].to_numpy(), side="right") - 1, 0, bins - 1
    )
    w = steps["duration_s"].to_numpy()
    num = np.bincount(idx, weights=w * values.to_numpy(dtype=float), minlength=bins)
    den = np.bincount(idx, weights=w, minlength=bins)
    keep = den > 0
    mids = (edges[:-1] + edges[1:]) / 2
    return mids[keep], num[keep] / den[keep]


def _save(fig: Figure, stem: Path) -> list[Path]:
    out = []
    # a fixed SVG id salt and no dates, so the same results give byte-identical figures
    with matplotlib.rc_context({"svg.hashsalt": "servesim"}):
        for ext in ("png", "svg"):
            p = stem.with_suffix(f".{ext}")
            fig.savefig(p, dpi=130 if ext == "png" else None, metadata=_meta(ext))
            out.append(p)
    return out


def _meta(ext: str) -> dict:
    return {"Software": None} if ext == "png" else {"Date": None, "Creator": None}


def plot_pareto(plan_csv: Path, out_png: Path) -> Path | None:
    """Cost ($/hour) against p95 TTFT of every sized deployment of a ``servesim plan``, read from
    its saved ``plan.csv``, and, beside it, cost against joules per output token (the plan's
    second objective) when the plan has energy figures: each panel's Pareto front (no other
    point is both cheaper and better) joined, the answer ringed. None when no deployment was
    sized (nothing to draw)."""
    df = pd.read_csv(plan_csv)
    df = df[df["status"] == "sized"].dropna(subset=["usd_per_hour", "ttft_p95_s"])
    if df.empty:
        return None
    energy = "joules_per_output_token" in df and df["joules_per_output_token"].notna().any()
    fig = Figure(figsize=(13, 4.8) if energy else (7.5, 4.8))
    panels = [("ttft_p95_s", 1000, "p95 TTFT (ms)")]
    if energy:
        panels.append(("joules_per_output_token", 1, "J per output token"))
    for i, (col, scale, label) in enumerate(panels):
        _pareto_panel(fig.add_subplot(1, len(panels), i + 1), df.dropna(subset=[col]), col,
                      scale, label)  # fmt: skip
    fig.suptitle("servesim plan: cost vs p95 TTFT and energy (verified: all units at the target "
                 "rate; others: one unit at >= its share)", fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    return out_png


def _pareto_panel(ax, df: pd.DataFrame, col: str, scale: float, label: str) -> None:
    df = df.sort_values(["usd_per_hour", col])
    front = df[df[col] < df[col].cummin().shift(fill_value=np.inf)]
    ax.scatter(df["usd_per_hour"], df[col] * scale, color="0.6", label="deployments")
    ax.plot(front["usd_per_hour"], front[col] * scale, "o-", color="C0", label="Pareto front")
    answer = df[df["answer"].astype(str) == "True"]
    if not answer.empty:
        ax.scatter(answer["usd_per_hour"], answer[col] * scale, s=220,
                   facecolors="none", edgecolors="C3", linewidths=2, label="answer")  # fmt: skip
    for _, r in df.iterrows():
        name = f"{r['gpu']} tp{int(r['tp'])} {r['precision']} x{int(r['replicas'])}"
        ax.annotate(name, (r["usd_per_hour"], r[col] * scale), fontsize=7,
                    xytext=(4, 3), textcoords="offset points")  # fmt: skip
    ax.set_xlabel("cost ($/hour)")
    ax.set_ylabel(label)
    ax.legend(fontsize=8)
