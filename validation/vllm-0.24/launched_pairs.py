"""Launched pairs on vLLM's own batches: each decode step followed by a prompt step planned
behind it, charged as the simulator charges them (`profiles.vllm_validate.charged_steps`: the
decode step at least the launch, the wait taken back from the prompt step), against the two
measured intervals, by prompt size.

    python validation/vllm-0.24/launched_pairs.py RUN TABLE CASE
    e.g. RUN validation/vllm-0.24/real/h200_qwen2.5-7b,
    TABLE profiles/h200/vllm-0.24/qwen2.5-7b_tp1, CASE conv_heavy

Why: where a served case's busy time is short (`report.json` -> `step_model_on_real_batches.
by_kind.prefill_launched`), this says which pairs and which part of the pair (no GPU).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from profiles import vllm_validate  # noqa: E402
from profiles.vllm_steps import read_steps  # noqa: E402
from simulator.latency.engine_steps import EngineStepModel  # noqa: E402

PROMPT_BINS = ((0, 512), (512, 1024), (1024, 2048), (2048, 4096), (4096, 1 << 20))


def pairs(run: Path, table: Path, case: str) -> np.ndarray:
    """Rows (prompt tokens, decodes beside it, decode measured / charged, prompt measured /
    charged) in ms, one per busy decode step with a prompt step launched behind it, charged as
    the report charges them (`profiles.vllm_validate.charged_steps`)."""
    real = vllm_validate.phase_steps(
        read_steps(str(run / "steps.jsonl")), vllm_validate.load_phase(run / f"{case}.json.gz")
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = EngineStepModel.as_measured(table)
    charged = vllm_validate.charged_steps(m, real)
    out = []
    for (r, _, c), (nxt, _, c_next) in zip(charged, charged[1:], strict=False):
        if nxt["prefill_behind"] and not r["after_idle"]:
            out.append((nxt["prefill_tokens"], nxt["decode_seqs"], r["dur_us"] / 1e3, c * 1e3,
                        nxt["dur_us"] / 1e3, c_next * 1e3))  # fmt: skip
    return np.array(out).reshape(-1, 6)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    a = pairs(Path(argv[0]), Path(argv[1]), argv[2])
    if not len(a):
        print("no launched pairs")
        return 0
    total = (a[:, 3] + a[:, 5]).sum() / (a[:, 2] + a[:, 4]).sum() - 1
    print(f"{argv[2]}: {len(a)} launched pairs, charged {total:+.1%} against measured")
    print("prompt tokens | pairs | decodes | pair ms measured / charged | decode part "
          "| prompt part")  # fmt: skip
    for lo, hi in PROMPT_BINS:
        s = a[(a[:, 0] >= lo) & (a[:, 0] < hi)]
        if len(s):
            med = [float(np.median(x)) for x in (s[:, 1], s[:, 2] + s[:, 4], s[:, 3] + s[:, 5],
                                                  s[:, 2], s[:, 3], s[:, 4], s[:, 5])]  # fmt: skip
            print(f"{lo}-{hi} | {len(s)} | {med[0]:.0f} | {med[1]:.1f} / {med[2]:.1f} | "
                  f"{med[3]:.1f} / {med[4]:.1f} | {med[5]:.1f} / {med[6]:.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
