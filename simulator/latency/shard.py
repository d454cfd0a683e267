"""Engine steps of a TP layout timed on one GPU: the shard's table plus the layout's collectives.

Why: DeepSeek-V3 is served at TP8 and gpt-oss-120b at TP2 or more, on machines this project
cannot always borrow. What one GPU of such a layout computes is a model of its own: the same
layers with the per-GPU shapes of `simulator.served.ShardedModel` (query and KV heads, MLP and
expert intermediate sizes and the vocabulary split ``tp`` ways; hidden size, layer count, expert
count and routing unchanged). vLLM runs that shard at TP1 on dummy weights
(``profiles.hf_config.shard_config``), through the same kernels, CUDA graphs and scheduler, and
its steps make an ordinary engine table (`simulator.latency.engine_steps`) whose ``meta.yaml``
says ``shard: {tp: K}``. What the shard cannot time is what joins the shards: the all-reduces
after attention and the MLP / experts of every layer. `ShardStepModel` adds them to every step,
at the rows the step runs (its CUDA-graph size: the collectives run inside the graph on padded
rows), from `simulator.latency.collectives.StepCollectives`: NCCL measured on this GPU at this
group size where a table exists (``profiles/h200/nccl_x2``), else the link estimate, flagged.

What this leaves out, and says in `describe`: vLLM's own all-reduce (a custom one-shot kernel
for small messages) is not NCCL's; the shard samples over ``vocab / tp`` logits where the layout
gathers the full vocabulary first; each GPU of the layout launches its own step, in step with
the others, where the shard's host launched one. How much all of it costs is measured where a
real layout was also timed: Llama-3-70B at TP2 on an H200 (profiles/README.md, "Shards").
"""

from __future__ import annotations

from pathlib import Path

from simulator.errors import ConfigError
from simulator.latency.collectives import StepCollectives
from simulator.latency.engine_steps import EngineStepModel


def shard_tp(meta: dict, path: str) -> int | None:
    """The TP layout a table's ``meta.yaml`` (read from ``path``) says it is one GPU of
    (``shard: {tp: K}``, ``K`` = its ``tp``), or None for a table of a whole engine."""
    shard = meta.get("shard")
    if shard is None:
        return None
    k = shard.get("tp") if isinstance(shard, dict) else None
    if isinstance(k, bool) or not isinstance(k, int) or k < 2 or k != meta.get("tp"):
        raise ConfigError(path, "shard.tp", f"expected the table's tp ({meta.get('tp')!r}, an "
                          f"integer >= 2), got {k!r}")  # fmt: skip
    return k


class ShardStepModel(EngineStepModel):
    """An engine table of one GPU's shard of a TP layout, plus that layout's collectives
    (module docstring). ``step_time`` = the shard's fitted step + `StepCollectives` at the
    step's padded rows; `predict_row` stays the shard's own step (what its table recorded, so
    `heldout` judges the fit on its own steps), `served_row` adds the collectives (what a real
    run of the layout records)."""

    def __init__(self, table_dir: str | Path, model_name: str, tp: int, coll: StepCollectives):
        super().__init__(table_dir, model_name, tp)
        if shard_tp(self.meta, str(self.dir / "meta.yaml")) is None:
            raise ConfigError(str(self.dir / "meta.yaml"), "shard", "missing: not a shard table")
        if coll.served.tp != tp:
            raise ValueError(f"collectives of tp {coll.served.tp} for a tp {tp} shard")
        self.coll = coll
        #: padded rows -> collective seconds of a step (a few dozen sizes per run)
        self._coll_s: dict[int, float] = {}

    def collective_s(self, tokens: int) -> float:
        """Collective seconds of a step of ``tokens`` tokens (prompt tokens + decodes), run at
        its CUDA-graph size (`padded`)."""
        p = self.padded(tokens)
        s = self._coll_s.get(p)
        if s is None:
            allreduce, expert = self.coll.seconds(p)
            s = self._coll_s[p] = allreduce + expert
        return s

    def step_time(
        self,
        prefill_tokens: int,
        prefill_attn: float,
        prefill_seqs: int,
        decode_seqs: int,
        decode_ctx: int,
        decode_max: int = 0,
    ) -> float:
        shard = super().step_time(
            prefill_tokens, prefill_attn, prefill_seqs, decode_seqs, decode_ctx, decode_max
        )
        return shard + self.collective_s(prefill_tokens + decode_seqs)

    def served_row(self, r: dict) -> float:
        """A recorded step of the whole layout as this model predicts it: the shard's time of
        its composition plus the collectives."""
        return self.predict_row(r) + self.collective_s(r["prefill_tokens"] + r["decode_seqs"])

    def describe(self) -> dict:
        out = super().describe()
        coll = self.coll.describe()
        out["shard"] = {
            "tp": self.coll.served.tp,
            "timed": "one GPU's shard at TP1 (per-GPU shapes); collectives added per step",
            "collectives": coll,
        }
        out["warnings"].append(
            f"{self.name}: one GPU's shard of tp {self.coll.served.tp} timed alone; the "
            "collectives that join the shards are added ("
            + ("NCCL measured on this GPU" if self.coll.measured else "estimated, not measured")
            + "; vLLM's custom all-reduce and the full-vocabulary sampler not timed)"
        )
        return out


__all__ = ["ShardStepModel", "shard_tp"]
