"""The neighbour oracle: how well a table's held-out decode steps predict one another, a lower
bound on how noisy the recording is.

Why: the held-out floor (p95 <= 10%) assumes a recording whose equal steps take equal times.
Some do not: on H200 DeepSeek-V2-Lite, eager decode steps of 768 sequences, one after another
and ~0.7% apart in context, took 64 to 103 ms in stretches (host speed; they are launch-bound).
Any function of the step's composition predicts those steps alike, so part of them must miss.
`repeat_spread` measures that noise where a grid timed one composition in several passes; this
measures it within one pass, from the chain of decode steps every decode scenario runs. A step's
neighbours ran just before and after it, in the same stretch of host speed, so the oracle knows
something no model of composition can: its error is a lower bound on the noise, and a model
near it on these steps has little left to gain there, while one far above it has model error.

A held-out decode-only step's *neighbours* are the other held-out decode-only steps of its
scenario and engine process with the same ``decode_seqs`` and a ``decode_ctx`` within
`CTX_TOLERANCE` of its own; with `MIN_NEIGHBOURS` or more, the oracle predicts it by their
median target. The report gives the oracle's |error| on the steps it predicts, and the
model's on the same steps, so the two read side by side. Rows are the held-out report's own
(`median_of_repeats` of the test split): the oracle is judged on what the model is judged on.

The *cross-pass oracle* removes that advantage where a grid was run in several passes, minutes
apart (``<scenario>~r<k>``): a held-out step of pass ``k`` (a single timing) is predicted by the
median of the held-out steps of the *other* passes of its base scenario with the same prompt
tokens, prompt sequences and decode sequences, and decode context and prompt attention within
`CTX_TOLERANCE`. Those ran the same composition at another time, in another host state: the
oracle is vLLM predicting itself across passes, what a perfect model of composition would score
against single timings (the model is judged on the same single timings beside it). Where its
p95 exceeds the floor, the recording does not repeat itself within the floor (on H200
DeepSeek-V2-Lite's three-pass run: 31% against 10%).
"""

from __future__ import annotations

from statistics import median

#: neighbours' decode context within this fraction of the step's own (the chain's steps grow
#: by one token per sequence: 2% spans tens of steps at the grid's contexts)
CTX_TOLERANCE = 0.02
#: neighbours a step needs before the oracle predicts it
MIN_NEIGHBOURS = 2
#: the separator of a repeat pass's scenario id (``dec_b8_c128~r1``), as the profiler names
#: them (`profiles.vllm_grid.repeated`, which reads it from here: simulator/ imports no profiles/)
REPEAT_SEP = "~r"


def scenario_pass(scenario_id: str) -> tuple[str, int]:
    """``(base scenario id, pass)`` of a scenario id: ``("dec_b8_c128", 1)`` for
    ``dec_b8_c128~r1``; pass 0 for a base id."""
    base, sep, r = scenario_id.rpartition(REPEAT_SEP)
    return (base, int(r)) if sep and r.isdigit() else (scenario_id, 0)


def _near(a: float, b: float) -> bool:
    """``a`` within `CTX_TOLERANCE` of ``b`` (exactly equal where ``b`` is 0)."""
    return abs(a - b) <= CTX_TOLERANCE * abs(b)


def neighbour_predictions(rows: list[dict]) -> list[tuple[dict, float]]:
    """``(row, oracle prediction)`` for every decode-only row with enough neighbours, in row
    order (see the module docstring)."""
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["prefill_tokens"] == 0:
            by.setdefault((r["scenario"], r.get("proc", 0), r["decode_seqs"]), []).append(r)
    predicted = {}
    for group in by.values():
        for r in group:
            ctx = r["decode_ctx"]
            near = [o["target"] for o in group if o is not r and _near(o["decode_ctx"], ctx)]
            if len(near) >= MIN_NEIGHBOURS:
                predicted[id(r)] = median(near)
    return [(r, predicted[id(r)]) for r in rows if id(r) in predicted]


def neighbour_oracle(model, rows: list[dict], stats) -> dict:
    """The oracle's and ``model``'s |relative error| statistics (``stats``: list of signed
    errors -> summary, its step count included) on the rows the oracle predicts."""
    return _beside_model(model, neighbour_predictions(rows), stats)


def _beside_model(model, pairs: list[tuple[dict, float]], stats) -> dict:
    """An oracle's ``(row, prediction)`` pairs as ``stats`` of its errors and of ``model``'s on
    the same rows."""
    return {
        "oracle": stats([p / r["target"] - 1 for r, p in pairs]),
        "model": stats([model.predict_row(r) / r["target"] - 1 for r, _ in pairs]),
    }


def cross_pass_predictions(rows: list[dict]) -> list[tuple[dict, float]]:
    """``(row, oracle prediction)`` for every row with a like step in another pass of its
    scenario, in row order (module docstring). Rows are single timings (``target``)."""
    by: dict[tuple, list[tuple[int, dict]]] = {}
    for r in rows:
        base, k = scenario_pass(r["scenario"])
        key = (base, r["prefill_tokens"], r["prefill_seqs"], r["decode_seqs"])
        by.setdefault(key, []).append((k, r))
    predicted = {}
    for group in by.values():
        for k, r in group:
            like = [
                o["target"]
                for ko, o in group
                if ko != k
                and _near(o["decode_ctx"], r["decode_ctx"])
                and _near(o["prefill_attn"], r["prefill_attn"])
            ]
            if like:
                predicted[id(r)] = median(like)
    return [(r, predicted[id(r)]) for r in rows if id(r) in predicted]


def cross_pass_oracle(model, rows: list[dict], stats) -> dict:
    """The cross-pass oracle's and ``model``'s |relative error| statistics on the rows the
    oracle predicts (``stats`` as `neighbour_oracle`'s), and how many rows it was given."""
    return {"given": len(rows), **_beside_model(model, cross_pass_predictions(rows), stats)}
