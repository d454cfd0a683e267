"""Each recorded engine step's decode contexts, rebuilt from the profiling run's requests.

Why: a model with sliding-window layers reads at most ``window`` keys per sequence on those
layers, so its latency features (`simulator.served.WindowedReads`) need how far each decoding
sequence's context exceeds the window, not just the sum the step log keeps (``dctx``). The
log has no per-sequence contexts, but a profiling run knows every request: its prompt, its
output length (ignore-EOS, so exact) and when it ended (or its scenario's end, for the
background requests a scenario aborts). A request's decodes run in the steps right after the
step that scheduled its last prompt chunk, one per step, with contexts ``prompt + 1``,
``prompt + 2``, ... until it has produced its output or ended.

Invariant: a step's rebuilt contexts are returned only when their count, sum and maximum equal
the logged ``nd``, ``dctx`` and ``dmax``; otherwise (the engine's warm-up requests, unknown to
the run's records; a preemption) the step gets None, and the table leaves it out where its
features depend on it. Nothing is guessed.
"""

from __future__ import annotations

from profiles.vllm_steps import record_key


def _ends(requests: dict, scenarios: list[dict]) -> dict[str, float]:
    """When each request stopped decoding at the latest: its end, or for a request aborted
    with its scenario (no end recorded), the scenario's end."""
    t1 = {sc["id"]: sc["t1"] for sc in scenarios}
    inf = float("inf")
    return {k: r.get("t_end", t1.get(k.rpartition("/")[0], inf)) for k, r in requests.items()}


def decode_contexts(steps: list[dict], requests: dict, scenarios: list[dict]) -> list:
    """Per step of ``steps`` (any order; the result follows it): the sorted context lengths
    (keys read, ``before + 1``) of its decodes, or None when the rebuild does not reproduce
    the logged counts (module docstring). ``requests``: the profile phase's records, keyed by
    ``"<scenario>/<index>"``, the part of vLLM's request id before its last ``-``."""
    ends = _ends(requests, scenarios)
    order = sorted(range(len(steps)), key=lambda i: steps[i]["t_sched"])
    out: list = [None] * len(steps)
    active: dict[str, list[int]] = {}  # request -> [context of its next decode, decodes left]
    for i in order:
        s = steps[i]
        for key in [k for k in active if ends[k] <= s["t_sched"]]:
            del active[key]
        ctxs = sorted(v[0] for v in active.values())
        if (len(ctxs), sum(ctxs), max(ctxs, default=0)) == (s["nd"], s["dctx"], s["dmax"]):
            out[i] = ctxs
        for key in list(active):
            v = active[key]
            v[0] += 1
            v[1] -= 1
            if v[1] == 0:
                del active[key]
        for rid, n, before in s["pf"]:
            key = record_key(rid)
            r = requests.get(key)
            if r is not None and before + n == r["prompt"] and r["out"] > 1:
                active[key] = [r["prompt"] + 1, r["out"] - 1]
    return out
