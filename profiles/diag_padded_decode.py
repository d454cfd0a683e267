"""Padded decode attention: op bench vs the step runner's own call vs the whole step (GPU only).

Usage: ``python -m profiles.diag_padded_decode MODEL TP BATCH TOTAL_CTX`` (prints JSON lines and
writes ``$OUT/padded_MODEL_tpTP_BATCH.json``). Why: padded decode-only steps are the worst
held-out steps of the 70B tables, and an op table of padded calls measured at two batches per
capture size made things worse (profiles/README.md). This times one composition every way,
per layer (us), to find which estimate disagrees with the whole step:

* ``bench_real`` / ``bench_padded``: the op bench (`measure.AttnBench`, fresh KV locations) at
  the real batch, and padded with one-token dummies to the capture size;
* ``runner_real`` / ``runner_padded``: the same calls on the runner's own KV pool and metadata
  (`StepRunner._metadata` / `_attn_meta`, as its decode graphs run them), timed like the bench;
* ``step_graph``: the whole decode-only step (CUDA graph, as in steps.csv) minus the same step
  with no context (one token per sequence), divided by the layer count: the attention's share.
"""

from __future__ import annotations

import json
import os
import statistics as st
import sys


def main(argv: list[str]) -> int:
    import torch

    from profiles.measure import AttnBench, uneven_lengths
    from profiles.timing import time_calls
    from profiles.torch_model import StepRunner
    from simulator.latency.table import CAPTURE_SIZES, max_k_bucket
    from simulator.models import load_model
    from simulator.served import ShardedModel

    name, tp, b, total = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    spec = load_model(name, "<diag>", "model")
    t = next(c for c in CAPTURE_SIZES if c >= b)
    klens = uneven_lengths(total, b)
    out = {"model": name, "tp": tp, "batch": b, "padded_to": t, "total_ctx": total}
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.inference_mode():
        sh = ShardedModel(spec, tp)
        bench = AttnBench(sh, 2**21)
        for key, q, k in (("bench_real", [1] * b, klens),
                          ("bench_padded", [1] * t, klens + [1] * (t - b))):  # fmt: skip
            out[key] = time_calls([bench.call(q, k, False)])["median_us"]
        del bench
        torch.cuda.empty_cache()
        r = StepRunner(spec, tp=tp, max_seqs=512, max_tokens=16384, max_model_len=65536)
        decodes = [(i, n) for i, n in enumerate(klens)]
        pads = [(-1 - i, 1) for i in range(t - b)]
        kc, vc = r.kv[0, 0], r.kv[0, 1]
        for key, seqs in (("runner_real", decodes), ("runner_padded", decodes + pads)):
            s, _, _, kv_lens, tables = r._metadata([], seqs, None)
            m = r._attn_meta(s, kv_lens, tables, 0, len(s), max_k=max_k_bucket(max(klens)))
            q = torch.randn(len(s), r.H, r.D, device="cuda", dtype=r.dtype)
            call = [lambda q=q, m=m: r._attn(q, kc, vc, m, causal=False)]
            out[key] = time_calls(call)["median_us"]
        noctx = [(i, 1) for i in range(b)]
        for key, seqs in (("step_graph_ms", decodes), ("step_noctx_ms", noctx)):
            for _ in range(3):
                r.run_step([], seqs)
            out[key] = st.median(r.run_step([], seqs) * 1e3 for _ in range(10))
        out["step_attn_per_layer"] = (out["step_graph_ms"] - out["step_noctx_ms"]) * 1e3 / r.L
        r.close()
    print(json.dumps(out), flush=True)
    path = os.path.join(os.environ.get("OUT", "."), f"padded_{name}_tp{tp}_{b}.json")
    with open(path, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
