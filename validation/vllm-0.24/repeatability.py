"""How well does a vLLM table predict another run of the same engine? (CPU, seconds)

    python validation/vllm-0.24/repeatability.py                      # the shipped repeat run
    python validation/vllm-0.24/repeatability.py --run RAW --table DIR --model M --gpu G

Default: ``repeat_h200_llama-3-8b/`` is a second profiling run of Llama-3-8B on the H200,
recorded five minutes after the one the shipped bf16 table is fitted on. Its job asked for int4
weights, but vLLM 0.24 quantized no layer (see profiles/README.md, "Precision"): it served bf16,
which the weights it loaded (14.96 GiB, checked again here by `check_weights_loaded`) prove. So
its engine record is read as bf16, its steps are labelled exactly as a table's are, and the
shipped table, which never saw any of them, predicts every usable one.

With ``--run``: any other profiling run's ``raw/`` folder (e.g. the run a re-profiled table
replaced, from git history: ``git archive REV PATH/raw | tar x -C /tmp/old``), predicted by the
table in ``--table``; the run is read at the precision its engine record names.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from profiles.vllm_table import build_table  # noqa: E402
from simulator.errors import ConfigError  # noqa: E402
from simulator.latency.engine_steps import EngineStepModel, _usable, error_summary  # noqa: E402
from simulator.models import load_model  # noqa: E402


def cross_run(run_raw: Path, table: Path, model: str, gpu: str, served_bf16: bool) -> dict:
    """``table``'s error on every usable step of the run in ``run_raw`` (labelled as a table's
    steps are), beside the table's own held-out error."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw"
        shutil.copytree(run_raw, raw)
        if served_bf16:
            facts = json.loads((raw / "engine.json").read_text())
            facts["precision"] = {"weights": "bf16", "kv_cache_dtype": "bf16"}  # what it served
            (raw / "engine.json").write_text(json.dumps(facts))
        facts = json.loads((raw / "engine.json").read_text())
        precision = facts.get("precision") or {}  # runs before precision was recorded: bf16
        tp = int((facts.get("job") or {}).get("tp", 1))  # the layout the run served
        spec = load_model({"base": model, **precision}, str(raw / "engine.json"), "precision")
        build_table(raw, Path(tmp), gpu, spec, tp)
        other = EngineStepModel(tmp, model, tp)
        shipped = EngineStepModel(table, model, tp)
        rows = [r for r in other.rows if _usable(r)]
        return {
            "table on every usable step of the other run": error_summary(shipped, rows),
            "table's own held-out steps": shipped.heldout(),
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", type=Path, help="a profiling run's raw/ folder")
    ap.add_argument("--table", type=Path, default=ROOT / "profiles/h200/vllm-0.24/llama-3-8b_tp1")
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--gpu", default="h200")
    a = ap.parse_args()
    repeat = a.run is None
    run = HERE / "repeat_h200_llama-3-8b" if repeat else a.run
    try:
        out = cross_run(run, a.table, a.model, a.gpu, served_bf16=repeat)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
