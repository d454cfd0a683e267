"""A step-latency model where every step takes the same time.

Not a model of any GPU: it exists so that runs can be computed by hand (tests, teaching,
queueing-theory checks such as M/D/1). Labelled ``constant`` in every output.
"""

from __future__ import annotations


class ConstantLatencyModel:
    name = "constant"

    def __init__(self, step_s: float):
        if not step_s > 0:
            raise ValueError(f"step_s must be > 0, got {step_s!r}")
        self.step_s = float(step_s)

    def step_time(
        self, prefill_tokens, prefill_attn, prefill_seqs, decode_seqs, decode_ctx, decode_max=0
    ):
        return self.step_s

    def describe(self) -> dict:
        return {"name": self.name, "step_s": self.step_s, "warnings": []}
