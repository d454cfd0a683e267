"""TPOT p50 / p95 and SLO attainment vs arrival rate for Qwen3-30B-A3B on two H200s in four
layouts: TP2, EP2 (both timed by tables measured through vLLM 0.24), EP with all-to-all (the
roofline bound) and two TP1 replicas (the TP1 vLLM table). Reads the two sweeps' index.csv
(means over seeds), prints the table it plots and writes the figure of moe_tp_vs_ep.yaml.

    servesim sweep experiments/moe_tp_vs_ep.yaml --jobs 2
    servesim sweep experiments/moe_two_replicas.yaml --jobs 2
    python experiments/moe_layouts_plot.py [--tp-ep results/moe_tp_vs_ep]
        [--replicas results/moe_two_replicas] [--out experiments/figures/moe_tp_vs_ep_tpot.png]
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

RATE = "workload.arrival.rate_per_s"
METRICS = (("tpot_p50_s", 1e3), ("tpot_p95_s", 1e3), ("ttft_p95_s", 1e3), ("slo_attainment", 100))
LAYOUTS = {
    "False": "TP2 (vLLM table)",
    "True": "EP2, all-reduce (vLLM table)",
    "all_to_all": "EP2, all-to-all (roofline)",
}


def layouts(tp_ep: str, replicas: str) -> dict[str, pd.DataFrame]:
    """Per layout, the means over seeds of `METRICS` by rate (done points only)."""
    cols = [m for m, _ in METRICS]
    a = pd.read_csv(f"{tp_ep}/index.csv")
    a = a[a["status"] == "done"]
    out = {
        LAYOUTS[str(ep)]: g.groupby(RATE)[cols].mean()
        for ep, g in a.groupby(a["hardware.expert_parallel"].astype(str))
    }
    b = pd.read_csv(f"{replicas}/index.csv")
    out["2 x TP1 replicas (vLLM table)"] = b[b["status"] == "done"].groupby(RATE)[cols].mean()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp-ep", default="results/moe_tp_vs_ep")
    ap.add_argument("--replicas", default="results/moe_two_replicas")
    ap.add_argument("--out", default="experiments/figures/moe_tp_vs_ep_tpot.png")
    a = ap.parse_args()
    data = layouts(a.tp_ep, a.replicas)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, d in data.items():
        print(name)
        print((d * [s for _, s in METRICS]).round(1).to_string())
        axes[0].plot(d.index, d["tpot_p50_s"] * 1e3, marker="o", label=name)
        axes[1].plot(d.index, d["slo_attainment"] * 100, marker="o", label=name)
    axes[0].set(xlabel="arrival rate (req/s)", ylabel="TPOT p50 (ms)")
    axes[1].set(xlabel="arrival rate (req/s)", ylabel="SLO attainment (%)", ylim=(0, 105))
    axes[0].legend(fontsize=8)
    fig.suptitle("Qwen3-30B-A3B on 2x H200, vLLM scheduler, ShareGPT (means of 2 seeds)")
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
