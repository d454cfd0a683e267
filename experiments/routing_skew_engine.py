"""What a skewed router does to vLLM's steps: Qwen3-30B-A3B (128 experts, top-8), gpt-oss-20b
(32 experts, top-4) and Mixtral-8x7B (8 experts, top-2) on one H200, each routed uniformly and
with ``routing_skew: 0.6`` (DeepSeek-R1's measured imbalance, `simulator.served`'s
``ROUTING_SKEW_SOURCE``), the two recorded on the same host one after the other (2026-11-27),
with the shipped uniform table beside them where it came from another host. Prints, per model
and decode batch, the measured median step of each ``dec_b<B>_c<C>`` scenario (all passes), the
skewed / uniform ratio, the cross-host ratio where there is one (the measurement's own
reproducibility) and the roofline's skewed / uniform ratio of its
work terms (what `model: roofline` charges a skew for); then pure prefill and mixed steps by
the two tables' fitted models; and writes the figure.

    python experiments/routing_skew_engine.py [--out experiments/figures/routing_skew_engine.png]
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402

from simulator.hardware import load_gpu  # noqa: E402
from simulator.latency.engine_steps import EngineStepModel  # noqa: E402
from simulator.latency.roofline import RooflineLatencyModel  # noqa: E402
from simulator.latency.routing_check import BOUND_TERMS  # noqa: E402
from simulator.models import load_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "profiles/h200/vllm-0.24"
AB = ROOT / "validation/vllm-0.24/skew_ab"
#: per model: the skewed table, the same host's uniform run and, where the shipped uniform table
#: came from another host, that table
TABLES = {
    **{
        model: {
            "skew 0.6": H200 / f"{model}_skew0.6_tp1",
            "uniform": AB / f"h200_{model}_uniform",
            "uniform, shipped (other host)": H200 / f"{model}_tp1",
        }
        for model in ("qwen3-30b-a3b", "gpt-oss-20b")
    },
    # both shipped, recorded one after the other on one H200 (2026-11-27)
    "mixtral-8x7b": {
        "skew 0.6": H200 / "mixtral-8x7b_skew0.6_tp1",
        "uniform": H200 / "mixtral-8x7b_tp1",
    },
}
OTHER_HOST = "uniform, shipped (other host)"
DECODE = re.compile(r"dec_b(\d+)_c(\d+)(~r\d+)?$")


def decode_medians(table: Path) -> pd.Series:
    """Median decode-only step (ms) of each ``dec_b<B>_c<C>`` scenario over its passes, at the
    scenario's full batch ``B`` (the steps while it fills or drains are left out)."""
    d = pd.read_csv(table / "steps.csv")
    m = d["scenario"].str.extract(DECODE)
    d = d.assign(batch=pd.to_numeric(m[0]), ctx=pd.to_numeric(m[1]))
    d = d[(d["prefill_tokens"] == 0) & (d["decode_seqs"] == d["batch"])]
    d = d.astype({"batch": int, "ctx": int})
    return d.groupby(["batch", "ctx"])["dur_us"].median() / 1e3


def roofline_ratio(name: str, batch: int, ctx: int) -> float:
    """The roofline's skewed / uniform work terms (no overhead) for a decode step."""
    gpu = load_gpu("h200", "routing_skew_engine", "gpu")
    out = []
    for skew in (0.6, 0.0):
        model = load_model({"base": name, "routing_skew": skew}, "-", "model")
        terms = RooflineLatencyModel(model, gpu, 1, 0.0).breakdown(0, 0.0, 0, batch, batch * ctx)
        out.append(sum(terms[k] for k in BOUND_TERMS))
    return out[0] / out[1]


def decode_table(model: str) -> pd.DataFrame:
    cols = {name: decode_medians(path) for name, path in TABLES[model].items()}
    t = pd.concat(cols, axis=1).dropna()
    t["skewed / uniform"] = t["skew 0.6"] / t["uniform"]
    if OTHER_HOST in t:
        t["shipped / uniform"] = t[OTHER_HOST] / t["uniform"]
    t["roofline skewed / uniform"] = [roofline_ratio(model, b, c) for b, c in t.index]
    return t


def fitted_steps(model: str) -> pd.DataFrame:
    """Pure prefill of one prompt and a mixed step (512 prompt tokens beside B decodes at 1k)
    by each same-host table's fitted model (ms)."""
    tables = TABLES[model]
    models = {n: EngineStepModel(tables[n], model, 1) for n in ("skew 0.6", "uniform")}
    rows = {}
    for n in (2048, 4096, 8192):
        rows[f"prefill {n}"] = (n, n * (n + 1) / 2, 1, 0, 0)
    for b in (16, 64, 256):
        rows[f"512 + {b} decodes"] = (512, 512 * 513 / 2, 1, b, b * 1024)
    t = pd.DataFrame(
        {n: {k: m.step_time(*f) * 1e3 for k, f in rows.items()} for n, m in models.items()}
    )
    t["skewed / uniform"] = t["skew 0.6"] / t["uniform"]
    return t


def routing_at_load(model: str) -> pd.DataFrame:
    """What each same-host run's routers did with random tokens at load (meta.yaml)."""
    out = {}
    for name in ("skew 0.6", "uniform"):
        meta = yaml.safe_load((TABLES[model][name] / "meta.yaml").read_text())
        seen = meta["routing_at_load"]
        out[name] = {
            "max/mean seen": seen["max_over_mean"]["seen"],
            "max/mean asked (limit)": seen["max_over_mean"]["asked"],
            "touched by 8 seen": seen["experts_touched"]["seen"]["8"],
            "touched by 8 asked": seen["experts_touched"]["asked"]["8"],
            "touched by 64 seen": seen["experts_touched"]["seen"]["64"],
            "touched by 64 asked": seen["experts_touched"]["asked"]["64"],
        }
    return pd.DataFrame(out)


def plot(tables: dict[str, pd.DataFrame], out: Path) -> None:
    fig, axes = plt.subplots(1, len(tables), figsize=(6 * len(tables), 4), sharey=True)
    for ax, (model, t) in zip(axes, tables.items(), strict=True):
        for ctx, g in t.groupby(level="ctx"):
            b = g.index.get_level_values("batch")
            ax.plot(b, g["skewed / uniform"], "o-", label=f"measured, context {ctx}")
        r = t.xs(1024, level="ctx")
        ax.plot(r.index, r["roofline skewed / uniform"], "k--", label="roofline (context 1024)")
        if "shipped / uniform" in r:
            ax.plot(r.index, r["shipped / uniform"], ":", color="grey", label="uniform, other host")
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("decode batch (sequences)")
        ax.set_title(f"{model}, routing_skew 0.6 (one H200, vLLM 0.24)", fontsize=10)
    axes[0].set_ylabel("decode step: skewed / uniform routing")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "experiments/figures/routing_skew_engine.png"))
    a = ap.parse_args()
    pd.set_option("display.width", 160)
    tables = {}
    for model in TABLES:
        print(f"## {model}\n")
        print(routing_at_load(model).to_string(), end="\n\n")
        tables[model] = decode_table(model)
        print(tables[model].round(3).to_string(), end="\n\n")
        print(fitted_steps(model).round(3).to_string(), end="\n\n")
    plot(tables, Path(a.out))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
