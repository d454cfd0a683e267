"""Decode stalls and long-prompt TTFT of `servesim sweep experiments/long_context.yaml`.

Reads ``results/long_context/*/seed*/`` (requests.csv, steps.csv) and prints, per prompt length
and token budget (means over seeds): the longest step that carried decodes (the worst stall a
running chat request sees), p99.9 of the inter-token gaps (each decode step contributes one gap
per decoding sequence), chat requests' (prompt <= 4096) TTFT p50/p95 and TPOT p99/max, and the
long requests' mean TTFT; writes ``results/long_context/plots/stalls.png``.
Run from the repository root: ``python3 experiments/long_context_stalls.py``.
"""

import glob
import json
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def table(root: str) -> pd.DataFrame:
    rows = []
    for d in sorted(glob.glob(f"{root}/*/seed*")):
        r = pd.read_csv(f"{d}/requests.csv")
        s = pd.read_csv(f"{d}/steps.csv")
        summary = json.loads(Path(f"{d}/summary.json").read_text())
        chat, long = r[r.input_tokens <= 4096], r[r.input_tokens > 4096]
        dec = s[s.decode_seqs > 0]
        gaps = np.repeat(dec.duration_s.to_numpy(), dec.decode_seqs.to_numpy().astype(int))
        rows.append(
            {
                "prompt": re.search(r"_(\d+k)\.csv", d).group(1),
                "budget": int(re.search(r"max_num_batched_tokens=(\d+)", d).group(1)),
                "max_decode_step_s": dec.duration_s.max(),
                "itl_p999_s": np.quantile(gaps, 0.999),
                "chat_ttft_p50_s": chat.ttft_s.quantile(0.5),
                "chat_ttft_p95_s": chat.ttft_s.quantile(0.95),
                "chat_tpot_p99_s": chat.tpot_s.quantile(0.99),
                "chat_tpot_max_s": chat.tpot_s.max(),
                "long_ttft_mean_s": long.ttft_s.mean(),
                "goodput_rps": summary["goodput_rps"],
                "latency_model": summary["latency_model"]["kind"],
            }
        )
    return pd.DataFrame(rows)


def main(root: str = "results/long_context") -> None:
    df = table(root)
    model = df.latency_model.iloc[0]
    means = df.drop(columns="latency_model").groupby(["prompt", "budget"]).mean()
    print(means.round(3).to_string())
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for prompt in ("32k", "64k", "128k"):
        m = means.loc[prompt]
        axes[0].plot(m.index, m.max_decode_step_s * 1e3, marker="o", label=f"{prompt} prompts")
        axes[1].plot(m.index, m.long_ttft_mean_s, marker="o", label=f"{prompt} prompts")
    axes[0].set_ylabel("longest step carrying decodes (ms)")
    axes[0].set_yscale("log")
    axes[1].set_ylabel("mean TTFT of the long requests (s)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("max_num_batched_tokens (131072: no chunking in effect)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(
        f"long_context: decode stall vs long-prompt TTFT, llama-3.1-8b on h200 (TP1), "
        f"latency model: {model}"
    )
    fig.tight_layout()
    out = Path(root) / "plots" / "stalls.png"
    out.parent.mkdir(exist_ok=True)
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main(*sys.argv[1:])
