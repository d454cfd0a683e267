"""Did a mixture-of-experts table's decode steps read as many experts as a real router would?

Why: engine tables are recorded on dummy weights (``load_format=dummy``: every weight uniform in
+-1e-3). A router on such weights need not spread a batch's tokens over the experts as a
trained one does: where it adds a bias (gpt-oss's router bias, DeepSeek-V3's score correction)
the bias outweighs the tiny token-dependent logits and every token picks the same experts; and
in bf16 such small logits tie often, which top-k breaks by expert index. A decode step then reads
the weights of a few experts instead of those of the ``expected_experts_touched`` that uniform
routing gives, and runs faster than real-weight serving would.

The check needs no GPU: each recorded decode-only step of ``MIN_BATCH`` sequences or more is
compared with a **lower bound** on that step under uniform routing (or the skewed routing a
table was recorded with, `routing_bound`), the roofline's time for the
step's GEMM weights and activations, attention, elementwise and LM-head traffic at the GPU's
datasheet peaks, with no fixed overhead and no collectives (`RooflineLatencyModel.breakdown`).
No step that really read those bytes can take less. When ``FLAG_SHARE`` of the checked steps or
more do, the table's routing was concentrated, and every run on it says so (``warnings``,
``summary.json``'s ``latency_model.routing_check``). Invariant: the check reads the table and the
model's description only; it changes no step time.
"""

from __future__ import annotations

from statistics import median

#: decode batches this large or larger are checked: uniform routing then touches several times
#: the experts one token does (Qwen3-30B-A3B at 8 sequences: 42 of 128 experts vs 8)
MIN_BATCH = 8
#: the share of checked steps below the routing bound (uniform, or the table's skew) that flags
#: a table
FLAG_SHARE = 0.25
#: at most this many steps are checked (evenly spaced over the table): the bound is slow-ish
MAX_STEPS = 600
#: the roofline terms that make the bound (its fixed overhead and collectives left out)
BOUND_TERMS = ("gemm", "attention", "elementwise", "lm_head")


def routing_bound(model, gpu, tp: int, expert_parallel: str | None = None, skew: float = 0.0):
    """The roofline whose work terms bound a step (no fixed overhead) for ``model`` on ``gpu``
    at ``tp`` (with ``expert_parallel``, the busiest GPU's share of the experts) under the
    routing the table was recorded with: uniform, or skewed by ``skew`` (a table recorded with
    a skewed router touches fewer experts, and its bound is lower): what `routing_check`
    compares with."""
    from simulator.latency.roofline import RooflineLatencyModel

    return RooflineLatencyModel(
        model, gpu, tp, 0.0, moe_routing_skew=skew, expert_parallel=expert_parallel
    )


def routing_check(rows: list[dict], roofline) -> dict:
    """Compare the recorded decode-only steps (``rows`` of an engine table, with ``target``
    seconds) of ``MIN_BATCH`` sequences or more with ``roofline``'s uniform-routing lower bound
    (module docstring). Returns the steps checked, how many ran below the bound, their share,
    the median measured / bound ratio per batch-size band, and ``concentrated`` (share >=
    ``FLAG_SHARE``)."""
    dec = [
        r for r in rows
        if not r["prefill_tokens"] and r["decode_seqs"] >= MIN_BATCH and r.get("target")
    ]  # fmt: skip
    stride = max(1, len(dec) // MAX_STEPS)
    ratios: list[tuple[int, float]] = []
    for r in dec[::stride]:
        terms = roofline.breakdown(0, 0.0, 0, r["decode_seqs"], r["decode_ctx"])
        bound = sum(terms[k] for k in BOUND_TERMS)
        ratios.append((r["decode_seqs"], r["target"] / bound))
    below = sum(1 for _, x in ratios if x < 1.0)
    share = below / len(ratios) if ratios else 0.0
    return {
        "decode_steps_checked": len(ratios),
        "below_routing_bound": below,
        "bound_routing_skew": roofline.moe_routing_skew,
        "share": share,
        "median_ratio_by_batch": _bands(ratios),
        "concentrated": bool(ratios) and share >= FLAG_SHARE,
    }


def _bands(ratios: list[tuple[int, float]]) -> dict[str, float]:
    """Median measured / bound ratio per band of decode batch sizes (8-31, 32-127, 128+)."""
    out = {}
    for lo, hi in ((MIN_BATCH, 31), (32, 127), (128, 1 << 30)):
        xs = [x for b, x in ratios if lo <= b <= hi]
        if xs:
            out[f"{lo}-{hi}" if hi < 1 << 30 else f"{lo}+"] = round(median(xs), 3)
    return out


def routing_warning(name: str, check: dict) -> str:
    """The warning a run on a flagged table carries."""
    skew = check["bound_routing_skew"]
    routing = f"expert routing skewed {skew:g}" if skew else "uniform expert routing"
    return (
        f"{name}: {check['below_routing_bound']} of {check['decode_steps_checked']} "
        f"decode steps of {MIN_BATCH}+ sequences ran faster than {routing} allows "
        f"(median measured / bound by batch: {check['median_ratio_by_batch']}): the dummy-weight "
        "router sent the batch to fewer experts than a trained one would, so decode here is "
        "likely faster than real-weight serving"
    )


__all__ = ["routing_check", "routing_warning", "routing_bound", "MIN_BATCH",
           "FLAG_SHARE"]  # fmt: skip
