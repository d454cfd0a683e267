"""Eager vs whole-step CUDA graph for every mixed composition of the profiler (GPU only).

Usage: ``python -m profiles.diag_graph_mixed MODEL TP`` (writes ``$OUT/graphs_MODEL_tpTP.json``).
Each mixed composition of ``step_compositions`` runs eagerly (median and p10 of 8) and as one
captured CUDA graph of the same forward (``mixed_mode="full"``, median and min of 8 replays) and
as piecewise graphs with eager attention (``mixed_mode="piecewise"``, median of 8), so the launch
floor, its noise and what piecewise graphs leave of it can be read off (profiles/README.md).
"""

from __future__ import annotations

import json
import os
import random
import statistics as st
import sys


def main(argv: list[str]) -> int:
    import torch

    from profiles.measure import _step_batch, step_compositions
    from profiles.torch_model import StepRunner
    from simulator.models import load_model

    name, tp = argv[0], int(argv[1])
    spec = load_model(name, "<diag>", "model")
    runner = StepRunner(
        spec, tp=tp, max_seqs=512, max_tokens=16384, max_model_len=65536, mixed_mode="piecewise"
    )
    comps = step_compositions(runner.capacity_tokens, runner.max_tokens, runner.max_model_len)
    rng = random.Random(3)  # the profiler's seed: the same decode contexts as steps.csv
    batches = {c["step_id"]: _step_batch(c, rng) for c in comps}
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    with torch.inference_mode():
        for c in (c for c in comps if c["kind"] == "mixed"):
            pre, dec = batches[c["step_id"]]
            row = {"step_id": c["step_id"], "prefills": c["prefills"], "decodes": c["decodes"]}
            try:
                times = {}
                for mode in ("eager", "piecewise", "full"):  # "full": first call captures
                    runner.mixed_mode = mode
                    for _ in range(2):
                        runner.run_step(pre, dec)
                    times[mode] = sorted(runner.run_step(pre, dec) * 1e3 for _ in range(8))
                runner.mixed_mode = "piecewise"
                runner._mixed = None
                row.update(eager_med=st.median(times["eager"]), eager_p10=times["eager"][1])
                row.update(piece_med=st.median(times["piecewise"]), piece_min=times["piecewise"][0])
                row.update(graph_med=st.median(times["full"]), graph_min=times["full"][0])
            except (RuntimeError, ValueError) as e:
                row["error"] = str(e)[:80]
            rows.append(row)
            print(json.dumps(row), flush=True)
    path = os.path.join(os.environ.get("OUT", "."), f"graphs_{name}_tp{tp}.json")
    with open(path, "w") as f:
        json.dump(rows, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
