"""Running a sweep's points on local processes or on Ray, with a progress bar and an index.

Both backends run the same `simulator.sweep.run_task` on the same tasks, so they give the same
files. Local: a ``ProcessPoolExecutor`` of ``jobs`` processes (``jobs == 1`` runs inline). Ray
(optional, ``pip install 'servesim[ray]'``): ``address`` joins an existing cluster, whose workers
must be able to import servesim; their results come back to this process, which writes them, so
no shared filesystem is needed. Without ``address`` a new local Ray instance is started (``jobs``
CPUs, a small object store, on 127.0.0.1) and stopped at the end; a Ray already initialised in
this process is used instead and left running. See `_ray_map` for loopback clusters and auth.

``OUT/index.csv`` (rewritten after every finished run, so an interrupted sweep keeps one) has a
row per run: point, folder, seed, status, config_hash, error, one column per swept key (its full
dotted name) and the headline metrics of `simulator.collect.headline`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import pandas as pd

from simulator.collect import headline
from simulator.errors import ConfigError
from simulator.sweep import Point, Task, expand, point_config, read_done_hash, run_task

INDEX_METRICS = (
    "ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "tpot_p50_s", "tpot_p95_s", "tpot_p99_s",
    "itl_p99_s", "e2e_p95_s", "throughput_rps", "output_tok_s", "goodput_rps", "slo_attainment",
    "kv_use_mean", "mean_batch_size", "preemptions", "completed", "rejected", "unfinished",
)  # fmt: skip


class Progress:
    """``[#####.....] 12/40 runs  2 skipped  1 failed  0:05 elapsed, ~0:12 left`` on a stream."""

    def __init__(self, total: int, jobs: int, stream=None, enabled: bool = True):
        self.total, self.jobs = total, max(jobs, 1)
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        self.done = self.skipped = self.failed = 0
        self.t0 = time.monotonic()
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def update(self, status: str) -> None:
        self.done += 1
        self.skipped += status == "skipped"
        self.failed += status == "failed"
        if self.enabled:
            end = "" if self._tty and self.done < self.total else "\n"
            prefix = "\r" if self._tty else ""
            print(prefix + self.line(), end=end, file=self.stream, flush=True)

    def line(self) -> str:
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        elapsed = time.monotonic() - self.t0
        ran = self.done - self.skipped
        left_runs = self.total - self.done
        if ran and left_runs:
            left = f", ~{_clock(elapsed / ran * left_runs)} left"
        else:
            left = ""
        extra = "".join(
            f"  {n} {what}" for n, what in ((self.skipped, "skipped"), (self.failed, "failed")) if n
        )
        return (
            f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} runs{extra}  "
            f"{_clock(elapsed)} elapsed{left}"
        )


def run_sweep(
    config: dict,
    where: str,
    base_dir: Path,
    out: Path,
    *,
    jobs: int = 1,
    backend: str = "local",
    address: str | None = None,
    progress: bool = True,
    stream=None,
    overrides: list[str] | None = None,
) -> pd.DataFrame:
    """Run every point of the sweep in ``config`` into ``out``; return (and write) the index.
    ``overrides`` are the ``--set`` items already applied to ``config`` (errors name them)."""
    base, points = expand(config, where)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    remote = backend == "ray" and address is not None
    # Ray workers need not share this process's working directory
    task_base = str(Path(base_dir).resolve()) if backend == "ray" else str(base_dir)
    tasks = [
        Task(
            point_config(base, p, where),
            where,
            task_base,
            p,
            read_done_hash(out / p.folder),
            None if remote else str(out.resolve()),
            tuple(overrides or ()),
        )  # fmt: skip
        for p in points
    ]
    bar = Progress(len(tasks), jobs, stream=stream, enabled=progress)
    rows: dict[str, dict] = {}
    for rec in _execute(tasks, jobs, backend, address):
        point = next(t.point for t in tasks if t.point.folder == rec["folder"])
        if remote or rec.get("lost"):
            _write_returned(out, point, rec)
        rows[rec["folder"]] = _row(out, point, rec)
        bar.update(rec["status"])
        _write_index(out, [rows[t.point.folder] for t in tasks if t.point.folder in rows])
    return _write_index(out, [rows[t.point.folder] for t in tasks])


def _execute(tasks: list[Task], jobs: int, backend: str, address: str | None):
    if backend == "ray":
        yield from _ray_map(tasks, jobs, address)
    elif backend != "local":
        raise ConfigError("<cli>", "--backend", f"expected local or ray, got {backend!r}")
    elif jobs <= 1:
        for t in tasks:
            yield run_task(t)
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(run_task, t) for t in tasks]
            for f in as_completed(futures):
                yield f.result()


RAY_OBJECT_STORE_BYTES = 256 * 1024**2  # a local instance's object store (results are small)


def _ray_map(tasks: list, jobs: int, address: str | None, fn=run_task, lost=None):
    """Run ``fn`` on each of ``tasks`` on Ray, yielding records as they finish.

    ``fn`` (default `run_task`) must never raise; ``lost(task, exc)`` makes the record of a
    task whose worker died (default `_lost`, for sweep tasks). ``servesim plan`` passes its own
    pair, so both commands share one way of starting and joining Ray.

    An already initialised Ray (``ray.init`` by the caller) is used as is and left running.
    Otherwise a local instance (``address`` None: ``jobs`` CPUs, a small object store, no
    dashboard) or the cluster at ``address`` is joined for the sweep and shut down after it. For
    a local instance or a loopback ``address`` Ray is kept on 127.0.0.1 (it otherwise advertises
    and listens on the machine's external address); a loopback head must then have been started
    the same way: ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ray start --head
    --node-ip-address=127.0.0.1 ...``. A worker that dies (out of memory, killed) makes its point
    fail like any other error; the rest go on.
    """
    if address is None or _is_loopback(address):
        # read by ray at import: use 127.0.0.1 as the node address instead of the external IP
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "<cli>", "--backend", "ray is not installed; pip install 'servesim[ray]' or use "
            "--backend local",
        ) from None  # fmt: skip
    repo = str(Path(__file__).resolve().parents[1])
    owned = not ray.is_initialized()
    if owned and address is None:
        ray.init(  # "local": a new instance even when a cluster runs on this machine
            address="local", num_cpus=max(jobs, 1), object_store_memory=RAY_OBJECT_STORE_BYTES,
            include_dashboard=False, log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": repo}},
        )  # fmt: skip
    elif owned:
        try:
            ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError) as e:
            raise ConfigError(
                "<cli>", "--address", f"cannot join the Ray cluster at {address}: "
                f"{str(e).splitlines()[0] if str(e) else type(e).__name__} (a cluster started "
                "with token authentication needs RAY_AUTH_MODE=token here too)",
            ) from None  # fmt: skip
    try:
        remote = ray.remote(num_cpus=1)(fn)
        by_ref = {remote.remote(t): t for t in tasks}
        pending = list(by_ref)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                yield ray.get(done[0])
            except Exception as e:  # the worker died or could not run the task at all
                yield (lost or _lost)(by_ref[done[0]], e)
    finally:
        if owned:
            ray.shutdown()


def _lost(task: Task, exc: Exception) -> dict:
    """The record of a task whose worker failed outside `run_task` (it never raises itself)."""
    text = str(exc).strip().splitlines()
    error = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    return {
        "folder": task.point.folder, "status": "failed", "hash": None, "error": error,
        "trace": str(exc) or error, "config": {"as_given": task.config}, "lost": True,
    }  # fmt: skip


def _is_loopback(address: str) -> bool:
    host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def _write_returned(out: Path, point: Point, rec: dict) -> None:
    """Write what a remote worker sent back (Ray with --address), or a lost task's failure."""
    from simulator.results import write_config, write_error, write_results
    from simulator.sweep import write_point_json

    run_dir = out / point.folder
    if rec["status"] == "done":
        write_results(run_dir, rec.pop("results"))
    elif rec["status"] == "failed":
        if not (rec.get("lost") and (run_dir / "config.yaml").is_file()):
            write_config(run_dir, rec["config"])
        write_error(run_dir, rec["trace"].rstrip())
    if rec["status"] != "skipped":
        write_point_json(run_dir, point, rec)


def _row(out: Path, point: Point, rec: dict) -> dict:
    summary = rec.get("summary")
    status = rec["status"]
    if status == "skipped":
        summary = json.loads((out / point.folder / "summary.json").read_text())
        status = "done"
    row = {
        "point": point.key,
        "folder": point.folder,
        "seed": point.seed,
        "status": status,
        "resumed": rec["status"] == "skipped",
        "config_hash": rec["hash"],
        "error": rec["error"] or "",
    }
    for k, v in point.values.items():
        row[k] = json.dumps(v) if isinstance(v, (dict, list)) else v
    metrics = headline(summary) if summary else {}
    for m in INDEX_METRICS:
        row[m] = metrics.get(m)
    return row


def _write_index(out: Path, rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    df.to_csv(out / "index.csv", index=False, float_format="%.9g")
    return df


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return (
        f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )
