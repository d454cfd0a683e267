"""Record every engine step vLLM v1 runs: its composition and when it was planned and finished.

Why: a latency table must be fitted on the steps the engine really executes (its kernels, CUDA
graphs, host work and async scheduling), and a scheduler must be checked against the batches the
engine really forms. vLLM's own per-iteration log (``enable_logging_iteration_details``) has
counts but no absolute clock; this hook wraps the two scheduler methods every step passes
through, inside the engine-core process:

* ``Scheduler.schedule`` (vllm/v1/core/sched/scheduler.py): after it returns, each scheduled
  request's ``num_computed_tokens`` has already been advanced by its ``num_scheduled_tokens``
  (``_update_after_schedule``), so ``before = num_computed_tokens - n``;
* ``Scheduler.update_from_output``: called once per step when the step's model output is ready
  (``step`` and ``step_with_batch_queue`` in vllm/v1/engine/core.py). Its entry time is the
  step's completion as the engine sees it, on ``time.monotonic()``, the frontend's clock too.

A scheduled request is a *decode* when it runs one token past its prompt, else a prefill (or
recompute) chunk. One JSON line per step:

``{"i", "t_sched", "t_done", "pf": [[req_id, n, before], ...], "nd", "dctx", "dmax",
"waiting", "running", "preempted"}``

where ``dctx`` sums the decodes' context lengths (keys read, ``before + 1``) and ``dmax`` is the
longest. The engine core is forked from the frontend (``VLLM_WORKER_MULTIPROC_METHOD=fork``,
vLLM's default while CUDA is untouched in the parent), so installing the patch before the engine
starts covers the child. Writes are buffered; a daemon thread flushes twice a second, so the
step loop pays a list append and a ``write`` into a buffer, not a system call.
"""

from __future__ import annotations

import gzip
import json
import os
import threading
import time

ENV = "SERVESIM_STEP_LOG"


def composition(sched, out) -> dict:
    """The step's composition from a `SchedulerOutput` just returned by ``sched.schedule``."""
    pf, nd, dctx, dmax = [], 0, 0, 0
    for rid, n in out.num_scheduled_tokens.items():
        req = sched.requests[rid]
        before = req.num_computed_tokens - n
        if n == 1 and before >= req.num_prompt_tokens:
            nd += 1
            dctx += before + 1
            dmax = max(dmax, before + 1)
        else:
            pf.append([rid, n, before])
    preempted = getattr(out, "preempted_req_ids", None) or ()
    return {
        "pf": pf,
        "nd": nd,
        "dctx": dctx,
        "dmax": dmax,
        "waiting": len(sched.waiting),
        "running": len(sched.running),
        "preempted": len(preempted),
    }


def record_key(request_id: str) -> str:
    """A profiling run's key of a request (``"<scenario>/<index>"``, `profiles.vllm_run`) from
    the id the engine logs, which vLLM suffixes with ``-<hex>``."""
    return request_id.rsplit("-", 1)[0]


class _Writer:
    """Buffered JSON-lines writer flushed by a daemon thread (opened lazily in the child)."""

    def __init__(self, path: str):
        self.path = path
        self.f = None
        self.lock = threading.Lock()

    def write(self, rec: dict) -> None:
        if self.f is None:
            self.f = open(f"{self.path}.{os.getpid()}", "a", buffering=1 << 20)
            threading.Thread(target=self._flusher, daemon=True).start()
        line = json.dumps(rec, separators=(",", ":")) + "\n"
        with self.lock:
            self.f.write(line)

    def _flusher(self) -> None:
        while True:
            time.sleep(0.5)
            with self.lock:
                self.f.flush()


def install(path: str) -> None:
    """Patch vLLM's scheduler class so every step is appended to ``path.<pid>``."""
    from vllm.v1.core.sched.scheduler import Scheduler

    if getattr(Scheduler, "_servesim_hooked", False):
        return
    writer = _Writer(path)
    orig_schedule, orig_update = Scheduler.schedule, Scheduler.update_from_output
    pending: dict[int, dict] = {}
    counter = [0]

    def schedule(self, *args, **kwargs):
        t0 = time.monotonic()
        out = orig_schedule(self, *args, **kwargs)
        if out.total_num_scheduled_tokens > 0:
            rec = composition(self, out)
            rec["t_sched"] = t0
            pending[id(out)] = rec
        return out

    def update_from_output(self, scheduler_output, model_output):
        t_done = time.monotonic()
        rec = pending.pop(id(scheduler_output), None)
        if rec is not None:
            rec["t_done"] = t_done
            rec["i"] = counter[0]
            counter[0] += 1
            writer.write(rec)
        return orig_update(self, scheduler_output, model_output)

    Scheduler.schedule = schedule
    Scheduler.update_from_output = update_from_output
    Scheduler._servesim_hooked = True


def read_steps(path_prefix: str) -> list[dict]:
    """All step records written under ``path_prefix`` (one file per engine-core process,
    ``.gz`` when archived), ordered by completion time. Read from several files, each row
    carries ``proc``: its engine process, numbered in the order they started (an archived
    run's single file keeps the numbers it was written with; `engine_processes`)."""
    folder = os.path.dirname(path_prefix) or "."
    base = os.path.basename(path_prefix)
    files: list[list[dict]] = []
    for name in sorted(os.listdir(folder)):
        if name.startswith(base + "."):
            path = os.path.join(folder, name)
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rt") as f:
                files.append([json.loads(line) for line in f if line.strip()])
    files = [f for f in files if f]
    if len(files) > 1:
        files.sort(key=lambda f: min(r["t_sched"] for r in f))
        for k, f in enumerate(files):
            for r in f:
                r["proc"] = k
    rows = [r for f in files for r in f]
    rows.sort(key=lambda r: r["t_done"])
    return rows


#: no step for this long means the engine restarted (a start with compile, graph capture and
#: warm-up took 40-110 s on the lent machines; a profile scenario waits 0.15 s for the next):
#: how `engine_processes` tells processes apart in runs archived before rows carried ``proc``
RESTART_GAP_S = 20.0


def engine_processes(steps: list[dict]) -> list[int]:
    """The engine process (0, 1, ... in start order) of each step of ``steps`` (completion
    order): the rows' ``proc`` where every row has one, else a new process after every idle
    gap of `RESTART_GAP_S` (one engine idle that long would read as two)."""
    if steps and all("proc" in r for r in steps):
        return [r["proc"] for r in steps]
    out, k = [], 0
    for i, r in enumerate(steps):
        if i and r["t_sched"] - steps[i - 1]["t_done"] > RESTART_GAP_S:
            k += 1
        out.append(k)
    return out
