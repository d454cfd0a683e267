"""Running a sweep's points on local processes or on Ray, with a progress bar and an index.

Both backends run the same `simulator.sweep.run_task` on the same tasks, so they give the same
files. Local: a ``ProcessPoolExecutor`` of ``jobs`` processes (``jobs == 1`` runs inline). Ray
(optional, ``pip install 'servesim[ray]'``): ``address`` joins an existing cluster, whose workers
must be able to import servesim; their results come back to this process, which writes them, so
no shared filesystem is needed. Without ``address`` a local Ray instance is started.

``OUT/index.csv`` (rewritten after every finished run, so an interrupted sweep keeps one) has a
row per run: point, folder, seed, status, config_hash, error, one column per swept key (its full
dotted name) and the headline metrics of `simulator.collect.headline`.
"""

from __future__ import annotations

import json
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
) -> pd.DataFrame:
    """Run every point of the sweep in ``config`` into ``out``; return (and write) the index."""
    base, points = expand(config, where)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    remote = backend == "ray" and address is not None
    tasks = [
        Task(
            point_config(base, p, where),
            where,
            str(base_dir),
            p,
            read_done_hash(out / p.folder),
            None if remote else str(out.resolve()),
        )  # fmt: skip
        for p in points
    ]
    bar = Progress(len(tasks), jobs, stream=stream, enabled=progress)
    rows: dict[str, dict] = {}
    for rec in _execute(tasks, jobs, backend, address):
        point = next(t.point for t in tasks if t.point.folder == rec["folder"])
        if remote:
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


def _ray_map(tasks: list[Task], jobs: int, address: str | None):
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "<cli>", "--backend", "ray is not installed; pip install 'servesim[ray]' or use "
            "--backend local",
        ) from None  # fmt: skip
    repo = str(Path(__file__).resolve().parents[1])
    if address is None:
        ray.init(
            num_cpus=max(jobs, 1), include_dashboard=False, log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": repo}}, ignore_reinit_error=True,
        )  # fmt: skip
    else:
        ray.init(address=address, log_to_driver=False, ignore_reinit_error=True)
    try:
        remote = ray.remote(num_cpus=1)(run_task)
        pending = [remote.remote(t) for t in tasks]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])
    finally:
        ray.shutdown()


def _write_returned(out: Path, point: Point, rec: dict) -> None:
    """Write what a remote worker sent back (Ray with --address)."""
    from simulator.results import write_config, write_error, write_results
    from simulator.sweep import write_point_json

    run_dir = out / point.folder
    if rec["status"] == "done":
        write_results(run_dir, rec.pop("results"))
    elif rec["status"] == "failed":
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
