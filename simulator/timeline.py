"""``servesim timeline RUN``: a run as a Chrome trace / Perfetto JSON (Trace Event Format).

Read from the run's ``steps.csv`` and ``requests.csv``; times in microseconds of simulated time.

* one process per replica ("replica N"); on its thread "engine steps" every step is a complete
  event (``ph: X``) named prefill / decode / mixed, with its batch composition as args;
* every request is an async span (``ph: b/e``, category ``request``) on its replica, with nested
  spans queued (arrival -> first scheduled), prefill (-> first token) and decode (-> finish);
  rejected requests are instant events with their reason; spans cut by the horizon end at the
  run's last step;
* counters per replica: KV blocks in use, batch size (prefill / decode sequences) and queue
  length (waiting / running), sampled at every step start.

Open the file in https://ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from simulator.collect import REQUEST_FILLED, REQUEST_NUMBERS, STEP_COLUMNS, read_results_csv
from simulator.errors import ConfigError
from simulator.files import check_out_file
from simulator.results import REQUEST_COLUMNS

STEP_ARGS = ("prefill_tokens", "prefill_seqs", "decode_seqs", "decode_ctx", "prefill_attn",
             "kv_blocks_used", "num_waiting", "num_running")  # fmt: skip


def build_events(steps: pd.DataFrame, requests: pd.DataFrame) -> list[dict]:
    ev: list[dict] = []
    end_s = float((steps["start_s"] + steps["duration_s"]).max()) if len(steps) else 0.0
    replicas = sorted(set(steps["replica"].tolist()) | set(requests["replica"].tolist()))
    for rep in replicas:
        name = f"replica {rep}" if rep >= 0 else "not routed"
        ev.append({"ph": "M", "name": "process_name", "pid": int(rep), "args": {"name": name}})
        ev.append({"ph": "M", "name": "thread_name", "pid": int(rep), "tid": 0,
                   "args": {"name": "engine steps"}})  # fmt: skip
    for row in steps.itertuples(index=False):
        pid, ts = int(row.replica), _us(row.start_s)
        kind = "mixed" if row.prefill_seqs and row.decode_seqs else (
            "prefill" if row.prefill_seqs else "decode")  # fmt: skip
        args = {k: _plain(getattr(row, k)) for k in STEP_ARGS if hasattr(row, k)}
        ev.append({"ph": "X", "name": kind, "cat": "step", "pid": pid, "tid": 0, "ts": ts,
                   "dur": _us(row.duration_s), "args": args})  # fmt: skip
        ev.append({"ph": "C", "name": "KV blocks in use", "pid": pid, "ts": ts,
                   "args": {"blocks": int(row.kv_blocks_used)}})  # fmt: skip
        ev.append(
            {
                "ph": "C",
                "name": "batch size",
                "pid": pid,
                "ts": ts,
                "args": {"prefill": int(row.prefill_seqs), "decode": int(row.decode_seqs)},
            }
        )
        ev.append(
            {
                "ph": "C",
                "name": "queue",
                "pid": pid,
                "ts": ts,
                "args": {"waiting": int(row.num_waiting), "running": int(row.num_running)},
            }
        )
    for r in requests.itertuples(index=False):
        ev += _request_events(r, end_s)
    return ev


def _request_events(r, end_s: float) -> list[dict]:
    pid = int(r.replica)
    base = {"cat": "request", "id": int(r.id), "pid": pid, "tid": 1}
    args = {"input_tokens": int(r.input_tokens), "output_tokens": int(r.output_tokens),
            "generated_tokens": int(r.generated_tokens), "preemptions": int(r.preemptions),
            "cached_tokens": int(r.cached_tokens), "status": r.status}  # fmt: skip
    if r.status == "rejected":
        return [{"ph": "i", "s": "p", "name": f"rejected request {int(r.id)}", "pid": pid,
                 "tid": 1, "ts": _us(r.arrival_s),
                 "args": {**args, "reason": r.reject_reason}}]  # fmt: skip
    marks = [r.arrival_s, r.first_scheduled_s, r.first_token_s, r.finish_s]
    known = [m for m in marks if _ok(m)]
    last = marks[-1] if _ok(marks[-1]) else max(end_s, known[-1])
    out = [{**base, "ph": "b", "name": f"request {int(r.id)}", "ts": _us(r.arrival_s),
            "args": args}]  # fmt: skip
    phases = ("queued", "prefill", "decode")
    for i, phase in enumerate(phases):
        start = marks[i]
        if not _ok(start):
            break
        stop = marks[i + 1] if _ok(marks[i + 1]) else last
        out.append({**base, "ph": "b", "name": phase, "ts": _us(start)})
        out.append({**base, "ph": "e", "name": phase, "ts": _us(stop)})
    out.append({**base, "ph": "e", "name": f"request {int(r.id)}", "ts": _us(last)})
    return out


def write_timeline(run_dir: Path, out: Path) -> int:
    run_dir = Path(run_dir)
    steps_p, req_p = run_dir / "steps.csv", run_dir / "requests.csv"
    for p in (steps_p, req_p):
        if not p.is_file():
            raise ConfigError(str(run_dir), "", f"no {p.name} here (a run folder written "
                              "without --no-steps is needed)")  # fmt: skip
    steps = read_results_csv(steps_p, STEP_COLUMNS, STEP_COLUMNS, STEP_COLUMNS)
    requests = read_results_csv(req_p, REQUEST_COLUMNS, REQUEST_NUMBERS, REQUEST_FILLED,
                                keep_default_na=False, na_values=[""])  # fmt: skip
    requests["reject_reason"] = requests["reject_reason"].astype(object).fillna("")
    events = build_events(steps, requests)
    doc = {"traceEvents": events, "displayTimeUnit": "ms",
           "otherData": {"run": str(run_dir), "time": "simulated"}}  # fmt: skip
    check_out_file(out)
    Path(out).write_text(json.dumps(doc, separators=(",", ":")))
    return len(events)


def _us(seconds: float) -> float:
    return round(float(seconds) * 1e6, 3)


def _ok(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _plain(v):
    return v.item() if hasattr(v, "item") else v
