"""How well does a vLLM table predict another run of the same engine? (CPU, seconds)

    python validation/vllm-0.24/repeatability.py

``repeat_h200_llama-3-8b/`` is a second profiling run of Llama-3-8B on the H200, recorded five
minutes after the one the shipped bf16 table is fitted on. Its job asked for int4 weights, but
vLLM 0.24 quantized no layer (see profiles/README.md, "Precision"): it served bf16, which the
weights it loaded (14.96 GiB, checked again here by `check_weights_loaded`) prove. So its engine
record is read as bf16, its steps are labelled exactly as a table's are, and the shipped table,
which never saw any of them, predicts every usable one.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from profiles.vllm_table import build_table  # noqa: E402
from simulator.latency.engine_steps import EngineStepModel, _usable, error_summary  # noqa: E402
from simulator.models import MODELS  # noqa: E402


def main() -> int:
    table = ROOT / "profiles/h200/vllm-0.24/llama-3-8b_tp1"
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw"
        shutil.copytree(HERE / "repeat_h200_llama-3-8b", raw)
        facts = json.loads((raw / "engine.json").read_text())
        facts["precision"] = {"weights": "bf16", "kv_cache_dtype": "bf16"}  # what it served
        (raw / "engine.json").write_text(json.dumps(facts))
        build_table(raw, Path(tmp), "h200", MODELS["llama-3-8b"], 1)
        repeat = EngineStepModel(tmp, "llama-3-8b", 1)
        shipped = EngineStepModel(table, "llama-3-8b", 1)
        rows = [r for r in repeat.rows if _usable(r)]
        out = {
            "shipped table on every usable step of the repeat run": error_summary(shipped, rows),
            "shipped table's own held-out steps": shipped.heldout(),
        }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
