"""Why are small eager prefill steps slower in serving runs than in the profiler? (GPU only)

The first profiler timed each step composition back to back (2 warm-ups, 5 repeats; it now uses
interleaved rounds, see ``profiles.measure.profile_steps``). In a serving run
an eager prefill step comes after a stretch of CUDA-graph decode steps and simulator work. This
times the same small prefill (1 sequence, 91 tokens, Llama-3-8B) in four settings and prints
GPU-event milliseconds (median, min, max over repeats):

* ``back_to_back``: as the first profiler did;
* ``after_decodes``: each prefill follows 30 decode-only graph replays (batch 2);
* ``after_decodes_gc_off``: the same with Python's garbage collector disabled;
* ``second_of_pair``: after the decodes, the prefill is run twice and the second one is timed.
"""

from __future__ import annotations

import gc
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from profiles.torch_model import StepRunner
    from simulator.models import load_model

    model = load_model("llama-3-8b", "diag", "model")
    r = StepRunner(model, num_blocks=4200, block_size=16, max_model_len=8192)
    pre = [(0, 91, 0)]
    dec = [(1, 500), (2, 700)]
    for _ in range(3):
        r.run_step(pre, dec)
        r.run_step([], dec)

    def decodes():
        for _ in range(30):
            r.run_step([], dec)

    res = {}
    res["back_to_back"] = [r.run_step(pre, []) for _ in range(20)]
    out = []
    for _ in range(20):
        decodes()
        out.append(r.run_step(pre, []))
    res["after_decodes"] = out
    gc.disable()
    out = []
    for _ in range(20):
        decodes()
        out.append(r.run_step(pre, []))
    gc.enable()
    res["after_decodes_gc_off"] = out
    out = []
    for _ in range(20):
        decodes()
        r.run_step(pre, [])
        out.append(r.run_step(pre, []))
    res["second_of_pair"] = out
    for k, v in res.items():
        ms = [x * 1e3 for x in v]
        print(f"{k}: median {statistics.median(ms):.2f} ms, min {min(ms):.2f}, max {max(ms):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
