"""How long vLLM's loop holds a decode step's output while it launches a prompt step behind it,
read from the raw step stamps of recorded runs (profiling or serving; no GPU needed).

Why: with async scheduling vLLM plans step P while step D runs, launches P, and only then
returns D's output, so D's stamp interval carries P's launch. The tables attribute that wait
from stamp intervals and a fitted step model (`simulator.latency.engine_steps`); this reads it
straight from the stamps, the same way for a profiling run and a serving replay, so the two can
be compared: DeepSeek-V2-Lite with token-dependent routing on one H200 held 83 ms (profiling)
against 68 ms (serving) behind prompt steps of 1-4k tokens, and 55 / 58 ms on dummy routing
(validation/vllm-0.24/README.md).

A launch here: D carries no prompt tokens and runs decodes, P carries prompt tokens and was
planned within `MAX_PLAN_GAP_S` of D (a step planned later waited for something else) and
before D's output came back; the launch is ``t_done(D) - t_sched(P)``. Printed per size of P
(prompt tokens + decodes).

Printed per engine process too, where a run had several (a resumed run, or one pass per engine,
`profiles.vllm_run`): the launch time is drawn per process. The H100 DeepSeek-V2-Lite table's
two processes, one host, minutes apart: eager launches 99 vs 64 ms, graph ones 20 vs 14 ms.

Run: ``python -m profiles.diag_launch RUN_DIR [RUN_DIR ...] [--by-decodes] [--by-family]``
(folders with steps.jsonl.*; ``--by-decodes``: the 1,025-4,096-token launches per process by
the decodes running beside them, `by_decodes`; ``--by-family``: the same per family of the
launched step, `by_family`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from profiles.vllm_steps import engine_processes, read_steps

#: a prompt step planned more than this after the decode step it follows is not launched behind
#: it (the loop was waiting for something else first)
MAX_PLAN_GAP_S = 0.030
#: sizes of the launched step (prompt tokens + decodes) the report groups by
SIZE_EDGES = (0, 512, 1024, 4096, 8192, 1 << 30)
#: ranges of the decodes running beside a launch (the decode step's ``nd``), `by_decodes`
DECODE_EDGES = (0, 8, 32, 128, 512, 1 << 30)
#: the launched steps `by_decodes` reads: one size range (prompt tokens + decodes), eager on
#: every shipped table and the commonest launched size in the serving replays
BY_DECODES_TOKENS = (1024, 4096)


def prompt_tokens(step: dict) -> int:
    """The prompt tokens a logged step ran (``pf``: [request, tokens, tokens before] per chunk,
    `profiles.vllm_steps`)."""
    return sum(chunk[1] for chunk in step.get("pf", ()))


def _launch_pairs(steps: list[dict]):
    """(D, P) for each decode step D followed by a prompt step P launched behind it (module
    docstring); ``steps`` in completion order."""
    for d, p in zip(steps, steps[1:], strict=False):
        if prompt_tokens(d) or not d.get("nd") or not prompt_tokens(p):
            continue
        # planned after D's output came back: nothing was launched behind D
        if 0 < p["t_sched"] - d["t_sched"] <= MAX_PLAN_GAP_S and p["t_sched"] < d["t_done"]:
            yield d, p


def _launch_row(d: dict, p: dict) -> tuple[int, int, float]:
    """(size of the launched step P, decodes of the step D it was launched behind, launch
    seconds) of one pair of `_launch_pairs`."""
    return prompt_tokens(p) + p.get("nd", 0), d["nd"], d["t_done"] - p["t_sched"]


def launches_behind(steps: list[dict]) -> list[tuple[int, int, float]]:
    """`_launch_row` of each launch in ``steps`` (completion order)."""
    return [_launch_row(d, p) for d, p in _launch_pairs(steps)]


def family(step: dict) -> str:
    """What submitted a prompt step's first chunk: the request id's leading name, the grid's
    scenario family in a profiling run (``arrive_b8_c1024/3`` -> ``arrive``), the case's trace
    in a serving replay (``conv_light/17`` -> ``conv``)."""
    rid = str(step["pf"][0][0])
    return rid.split("/")[0].split("_")[0]


def by_family(steps: list[dict]) -> dict[str, list[dict]]:
    """`by_decodes` of the launches in ``steps`` per family of the launched step (`family`).
    Why: tests whether serving-like load sets the launch level. In one engine process, the
    grid's ``arrive`` prompts land beside a streaming population (arrivals at seeded gaps,
    hundreds of requests in flight in its large bases) and ``inject`` prompts one at a time; a
    host-load effect would make ``arrive`` launches the slower ones in every process."""
    found: dict[str, list] = {}
    for d, p in _launch_pairs(steps):
        found.setdefault(family(p), []).append(_launch_row(d, p))
    return {fam: by_decodes(rows) for fam, rows in sorted(found.items())}


def launches(steps: list[dict]) -> list[tuple[int, float]]:
    """(size of the launched step, launch seconds): `launches_behind` without the decodes."""
    return [(n, w) for n, _, w in launches_behind(steps)]


def by_decodes(found: list[tuple[int, int, float]]) -> list[dict]:
    """Count and median (ms) of the launches of `BY_DECODES_TOKENS`-sized steps per range of the
    decodes running beside them (`DECODE_EDGES`). Why: the tables charge one launch
    distribution per kind (graph / eager), whatever the running batch, while the host work of
    launching a step may grow with the sequences it carries (a reading, not a fitted feature)."""
    lo_n, hi_n = BY_DECODES_TOKENS
    rows = []
    for lo, hi in zip(DECODE_EDGES, DECODE_EDGES[1:], strict=False):
        ms = [w * 1e3 for n, nd, w in found if lo_n < n <= hi_n and lo < nd <= hi]
        if ms:
            rows.append({"decodes": f"{lo + 1}-{hi}", "n": len(ms), "p50": float(np.median(ms))})
    return rows


def by_size(found: list[tuple[int, float]]) -> list[dict]:
    """Count and p10 / p50 / p90 (ms) of the launches per size range (`SIZE_EDGES`)."""
    rows = []
    for lo, hi in zip(SIZE_EDGES, SIZE_EDGES[1:], strict=False):
        ms = [w * 1e3 for n, w in found if lo < n <= hi]
        if ms:
            p10, p50, p90 = np.percentile(ms, [10, 50, 90])
            rows.append({"tokens": f"{lo + 1}-{hi}", "n": len(ms), "p10": p10, "p50": p50,
                         "p90": p90})  # fmt: skip
    return rows


def by_process(steps: list[dict]) -> list[list[dict]]:
    """``steps`` split by engine process (`profiles.vllm_steps.engine_processes`), in order."""
    procs = engine_processes(steps)
    out: list[list[dict]] = [[] for _ in range(max(procs, default=-1) + 1)]
    for p, s in zip(procs, steps, strict=True):
        out[p].append(s)
    return out


def launches_by_process(steps: list[dict], graph_max: int) -> list[dict]:
    """Per engine process: its steps, and the count and median (ms) of its launches within the
    largest CUDA graph (``graph``: launched steps of at most ``graph_max`` tokens) and above it
    (``eager``); a kind with no launch has a null median. What a table's meta.yaml records: how
    far its processes' launch times lie apart."""
    out = []
    for part in by_process(steps):
        found = launches(part)
        kinds = {"graph": [w for n, w in found if n <= graph_max],
                 "eager": [w for n, w in found if n > graph_max]}  # fmt: skip
        out.append({
            "steps": len(part),
            **{k: {"launches": len(v),
                   "p50_ms": round(float(np.median(v)) * 1e3, 2) if v else None}
               for k, v in kinds.items()},
        })  # fmt: skip
    return out


def _cells(rows: list[dict]) -> str:
    """`by_decodes` rows as one printed line."""
    return "; ".join(f"{r['decodes']}: {r['p50']:.1f} ms ({r['n']})" for r in rows)


def _print(found: list[tuple[int, float]], indent: str) -> None:
    for r in by_size(found):
        print(f"{indent}{r['tokens']:>14} tokens: {r['n']:4d} launches, p10 / p50 / p90 "
              f"{r['p10']:.1f} / {r['p50']:.1f} / {r['p90']:.1f} ms")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders holding steps.jsonl.*")
    ap.add_argument(
        "--by-decodes",
        action="store_true",
        help="also the 1,025-4,096-token launches by the decodes beside them",
    )
    ap.add_argument(
        "--by-family",
        action="store_true",
        help="also the 1,025-4,096-token launches per process by the family of the launched "
        "step (grid scenario family, or a replay's trace) and the decodes beside them",
    )
    a = ap.parse_args(argv)
    for run in a.runs:
        if not Path(run).is_dir():
            ap.error(f"{run}: not a folder (expected a run folder holding steps.jsonl.*)")
        steps = read_steps(str(Path(run) / "steps.jsonl"))
        if not steps:
            ap.error(f"{run}: no steps.jsonl.* here (expected a run folder of profiles.vllm_run)")
        procs = by_process(steps)
        print(f"{run}: {len(steps)} steps, {len(procs)} engine process(es)")
        _print(launches(steps), "  ")
        for k, part in enumerate(procs if len(procs) > 1 else []):
            print(f"  engine process {k} ({len(part)} steps):")
            _print(launches(part), "    ")
        for k, part in enumerate(procs if a.by_decodes else []):
            head = f"  process {k}, 1,025-4,096-token launches by decodes beside"
            print(f"{head}: {_cells(by_decodes(launches_behind(part)))}")
        for k, part in enumerate(procs if a.by_family else []):
            for fam, rows in by_family(part).items():
                print(f"  process {k}, {fam}: {_cells(rows) or 'none of 1,025-4,096 tokens'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
