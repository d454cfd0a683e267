"""Step time vs batch for Llama-3-8B on one H200, bf16 vs FP8 (W8A8 + FP8 KV) vs int4 (GPTQ w4a16,
group 128, bf16 KV), measured through vLLM 0.24.0 and as the roofline bound sees it (CPU,
seconds; the figure of quantization.yaml).

    python experiments/quantization_decode.py [--out experiments/figures/quantization_steps.png]

Decode-only steps at 1,024 tokens of context per sequence, and single-prompt prefill steps,
predicted by the tables measured through vLLM (`profiles/h200/vllm-0.24/llama-3-8b_tp1`,
`..._fp8_tp1`, `..._int4-kv-bf16_tp1`: vLLM ran the int4 one with its Machete kernel)
and by the roofline model from the same model description. Prints the table it plots.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.hardware import GPUS  # noqa: E402
from simulator.latency.engine_steps import EngineStepModel  # noqa: E402
from simulator.latency.roofline import RooflineLatencyModel  # noqa: E402
from simulator.models import MODELS  # noqa: E402

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
PROMPTS = (128, 256, 512, 1024, 2048, 4096, 8192)
CTX = 1024


def models() -> dict:
    bf16 = MODELS["llama-3-8b"]
    fp8 = dataclasses.replace(bf16, weights="fp8", kv_cache_dtype="fp8")
    int4 = dataclasses.replace(bf16, weights="int4")
    tables = ROOT / "profiles/h200/vllm-0.24"
    return {
        "bf16 (vLLM)": EngineStepModel(tables / "llama-3-8b_tp1", "llama-3-8b", 1),
        "fp8 (vLLM)": EngineStepModel(tables / "llama-3-8b_fp8_tp1", "llama-3-8b", 1),
        "int4 (vLLM)": EngineStepModel(tables / "llama-3-8b_int4-kv-bf16_tp1", "llama-3-8b", 1),
        "bf16 (roofline)": RooflineLatencyModel(bf16, GPUS["h200"], 1),
        "fp8 (roofline)": RooflineLatencyModel(fp8, GPUS["h200"], 1),
        "int4 (roofline)": RooflineLatencyModel(int4, GPUS["h200"], 1),
    }


def decode_ms(lat, b: int) -> float:
    return 1e3 * lat.step_time(0, 0.0, 0, b, b * CTX, CTX)


def prefill_ms(lat, p: int) -> float:
    return 1e3 * lat.step_time(p, p * (p + 1) / 2, 1, 0, 0, 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "experiments/figures/quantization_steps.png"))
    a = ap.parse_args()
    lats = models()
    print("decode step (ms) at 1024-token contexts; fp8/bf16 and int4/bf16 ratios")
    for b in BATCHES:
        t = {k: decode_ms(m, b) for k, m in lats.items()}
        print(f"  B={b:<4}" + "".join(f" {k} {v:6.2f}" for k, v in t.items()) + _ratios(t))
    print("prefill step of one prompt (ms)")
    for p in PROMPTS:
        t = {k: prefill_ms(m, p) for k, m in lats.items()}
        print(f"  P={p:<5}" + "".join(f" {k} {v:7.1f}" for k, v in t.items()) + _ratios(t))
    _plot(lats, Path(a.out))
    return 0


def _ratios(t: dict) -> str:
    """Each quantized step time over bf16's, for the vLLM tables and for the roofline."""
    return "  ratio " + " ".join(
        f"{q} {src} {t[f'{q} ({src})'] / t[f'bf16 ({src})']:.2f}"
        for q in ("fp8", "int4")
        for src in ("vLLM", "roofline")
    )


def _plot(lats: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for k, m in lats.items():
        style = "-o" if "vLLM" in k else "--"
        ax1.plot(BATCHES, [decode_ms(m, b) for b in BATCHES], style, label=k, ms=3)
        ax2.plot(PROMPTS, [prefill_ms(m, p) for p in PROMPTS], style, label=k, ms=3)
    ax1.set(xscale="log", yscale="log", xlabel="decode batch (1,024-token contexts)",
            ylabel="step time (ms) = TPOT at that batch", title="decode step")  # fmt: skip
    ax2.set(xscale="log", yscale="log", xlabel="prompt tokens (one prompt)",
            ylabel="step time (ms)", title="prefill step")  # fmt: skip
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle("Llama-3-8B, 1x H200: bf16 vs FP8 (W8A8 + FP8 KV), vLLM 0.24.0 tables vs roofline")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"figure: {out}")


if __name__ == "__main__":
    sys.exit(main())
