"""How well one GPU's shard plus collectives predicts the real TP layout's steps.

    python validation/vllm-0.24/shard_check.py \
        --shard validation/vllm-0.24/shard_h200_llama-3-70b_tp2 \
        --real profiles/h200/vllm-0.24/llama-3-70b_tp2 --model llama-3-70b --tp 2 --gpu h200

Why: a shard table (`simulator.latency.shard`) times what one GPU of a TP layout computes and
adds the collectives the shard cannot run. Where the real layout was also profiled through vLLM,
its recorded steps (every usable one: nothing of them was fitted by the shard model) say how
close that sum comes to the engine, with the collectives measured (NCCL on this GPU) and with
the link estimate. The real table's own held-out error is printed beside it as the floor.
Writes JSON to stdout (``--out FILE`` too).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from statistics import median
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from simulator.hardware import default_tp_link, load_gpu  # noqa: E402
from simulator.latency.collectives import StepCollectives, load_collectives  # noqa: E402
from simulator.latency.engine_steps import (  # noqa: E402
    EngineStepModel,
    error_summary,
    median_of_repeats,
)
from simulator.latency.shard import ShardStepModel  # noqa: E402
from simulator.models import load_model  # noqa: E402
from simulator.served import ShardedModel  # noqa: E402


def check(shard_dir: Path, real_dir: Path, model: str, tp: int, gpu: str) -> dict:
    spec = load_model(model, "--model", "model")
    gpu_spec = load_gpu(gpu, "--gpu", "gpu")
    real = EngineStepModel(real_dir, spec.name, tp)
    rows = median_of_repeats(real.rows)
    served = ShardedModel(spec, tp)
    nccl = ROOT / "profiles" / gpu / f"nccl_x{tp}"
    modes = {"estimate": None}
    if (nccl / "meta.yaml").is_file():
        modes["measured"] = load_collectives(nccl)
    out = {
        "shard": str(shard_dir),
        "real": str(real_dir),
        "real_steps": len(rows),
        "real_table_heldout": error_summary(real, median_of_repeats(
            [r for r in real.rows if r["split"] == "test"])),
    }  # fmt: skip
    for mode, measured in modes.items():
        coll = StepCollectives(served, default_tp_link(gpu_spec), measured)
        shard = ShardStepModel(shard_dir, spec.name, tp, coll)
        mine = [dict(r) for r in rows]
        shard.set_row_dips(mine)
        out[mode] = _errors(shard, mine)
    return out


def _errors(shard: ShardStepModel, rows: list[dict]) -> dict:
    """|sim / real - 1| (median, p95, max: `error_summary`, as a table's held-out report) of the
    shard + collectives on the real layout's steps, by regime, with the median signed error and
    the collectives' median share of the predicted time."""
    out = error_summary(SimpleNamespace(predict_row=shard.served_row), rows)
    regimes = {
        "all": rows,
        "decode_only": [r for r in rows if r["prefill_tokens"] == 0],
        "with_prefill": [r for r in rows if r["prefill_tokens"] > 0],
    }
    for name, sel in regimes.items():
        if sel:
            out[name]["median_signed"] = median(shard.served_row(r) / r["target"] - 1 for r in sel)
            out[name]["collectives_share_median"] = median(
                shard.collective_s(r["prefill_tokens"] + r["decode_seqs"]) / shard.served_row(r)
                for r in sel
            )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shard", required=True, help="the shard table's folder")
    ap.add_argument("--real", required=True, help="the real layout's engine table")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--gpu", required=True, help="catalog GPU (its profiles/<gpu>/nccl_x<tp>)")
    ap.add_argument("--out", help="also write the JSON here")
    a = ap.parse_args()
    warnings.simplefilter("ignore", RuntimeWarning)  # extrapolation notes of the fits
    res = check(Path(a.shard), Path(a.real), a.model, a.tp, a.gpu)
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
