"""GPU energy readings while an engine runs: NVML's cumulative energy counter, sampled.

Why the counter and not power: a decode step lasts 5-50 ms, far below the ~100 ms at which the
driver refreshes its power readings (and ``power.draw`` is a 1 s average on Hopper). NVML's
``nvmlDeviceGetTotalEnergyConsumption`` (millijoules since the driver loaded) integrates power in
the driver, so the energy of any window of a second or more (one profiling scenario, one
replayed case) is the difference of two readings, whatever the power did inside it.

`EnergySampler` reads the counter of every GPU the engine can see (``CUDA_VISIBLE_DEVICES``:
NVML itself sees every GPU of the host) every ``period_s`` on a daemon thread and
appends ``[monotonic_s, [mJ per GPU]]`` lines to a file; `read_energy` gathers them and
`energy_between` interpolates the counter at both ends of a window. Calls NVML through ctypes
(``libnvidia-ml.so.1`` ships with every NVIDIA driver), so nothing needs installing on a GPU
machine. Without NVML the sampler says so and records nothing:
tables built from such runs say that they carry no energy.
"""

from __future__ import annotations

import ctypes
import gzip
import json
import os
import threading
import time
from bisect import bisect_left
from pathlib import Path


class NvmlError(RuntimeError):
    pass


def visible_devices(env: str | None, count: int) -> list[int]:
    """NVML indices of the GPUs ``CUDA_VISIBLE_DEVICES`` (``env``) leaves visible, of ``count``
    on the host: all when unset; comma-separated indices otherwise (CUDA and NVML number
    identical GPUs of one host alike, by PCI bus). GPU UUIDs or an index out of range are an
    error: a run must not charge one GPU's engine with another GPU's energy."""
    if env is None:
        return list(range(count))
    out = []
    for part in (x.strip() for x in env.split(",") if x.strip()):
        if not part.isdigit() or int(part) >= count:
            raise NvmlError(
                f"CUDA_VISIBLE_DEVICES={env!r}: expected indices below {count} (this host's GPUs)"
            )
        out.append(int(part))
    return out


class _Nvml:
    """The four NVML calls this module needs, on the GPUs ``CUDA_VISIBLE_DEVICES`` leaves."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError as e:
            raise NvmlError(f"libnvidia-ml.so.1 not loadable: {e}") from None
        self._check(self.lib.nvmlInit_v2(), "nvmlInit_v2")
        n = ctypes.c_uint()
        self._check(self.lib.nvmlDeviceGetCount_v2(ctypes.byref(n)), "nvmlDeviceGetCount_v2")
        self.devices = visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), n.value)
        self.handles = []
        for i in self.devices:
            h = ctypes.c_void_p()
            self._check(
                self.lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)), "GetHandleByIndex"
            )
            self.handles.append(h)

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc != 0:
            raise NvmlError(f"{what} returned NVML error {rc}")

    def energy_mj(self) -> list[int]:
        out = []
        for h in self.handles:
            v = ctypes.c_ulonglong()
            self._check(
                self.lib.nvmlDeviceGetTotalEnergyConsumption(h, ctypes.byref(v)),
                "nvmlDeviceGetTotalEnergyConsumption",
            )
            out.append(v.value)
        return out


class EnergySampler:
    """Samples the cumulative energy counters of the engine's GPUs on a background thread and
    appends them to ``path`` (JSON lines, flushed about every second), so a process killed
    mid-run leaves its readings; `read_energy` merges the files of every process of a run.

    Invariant: the samples of one file are ordered by time and each GPU's counter never
    decreases (it is the driver's counter, shared by every process on the machine).
    """

    def __init__(self, path: Path, period_s: float = 0.02) -> None:
        self.path, self.period_s = Path(path), period_s
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # one handle, written by the sampling thread and by `mark` under one lock: whole
        # lines only, so a window mark never lands inside a batch of samples
        self._file = open(self.path, "a")  # closed by stop()
        self._lock = threading.Lock()
        try:
            self._nvml = _Nvml()
        except NvmlError as e:
            self._nvml, self.error = None, str(e)
        devices = self._nvml.devices if self._nvml is not None else None
        self._write(
            [{"source": SOURCE, "period_s": period_s, "error": self.error, "devices": devices}]
        )

    def _write(self, objs: list) -> None:
        with self._lock:
            self._file.writelines(json.dumps(x) + "\n" for x in objs)
            self._file.flush()

    def start(self) -> EnergySampler:
        if self._nvml is not None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="energy")
            self._thread.start()
        return self

    def mark(self, key: str, t0: float, t1: float) -> None:
        """Record a named window (e.g. the idle one) beside the samples."""
        self._write([{key: [t0, t1]}])

    def _run(self) -> None:
        batch: list = []
        while not self._stop.is_set():
            try:
                batch.append([time.monotonic(), self._nvml.energy_mj()])
            except NvmlError as e:
                self.error = str(e)
                batch.append({"error": self.error})
                break
            if len(batch) * self.period_s >= 1.0:
                self._write(batch)
                batch = []
            self._stop.wait(self.period_s)
        self._write(batch)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._file.close()


SOURCE = "nvml total_energy_consumption"


def read_energy(folder: Path) -> dict | None:
    """Every process's readings under ``folder`` (``energy.<pid>.jsonl``, or one archived
    ``energy.json.gz``) as one record ``{source, period_s, error, t, mj, idle_window}``, samples
    in time order; None when the run has none."""
    folder = Path(folder)
    archived = folder / "energy.json.gz"
    if archived.is_file():
        with gzip.open(archived, "rt") as f:
            return json.load(f)
    files = sorted(folder.glob("energy.*.jsonl"))
    if not files:
        return None
    rec: dict = {"source": SOURCE, "period_s": None, "error": None, "idle_window": None}
    samples = []
    for path in files:
        for line in path.read_text().splitlines():
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:  # the last line of a killed process
                continue
            if isinstance(obj, list):
                samples.append(obj)
            else:
                rec.update({k: v for k, v in obj.items() if v is not None})
    samples.sort(key=lambda x: x[0])
    rec["t"], rec["mj"] = [x[0] for x in samples], [x[1] for x in samples]
    return rec


def keep_devices(record: dict, keep: list[int], why: str) -> dict:
    """``record`` with only the counters of NVML GPUs ``keep`` (for a run whose sampler read
    GPUs its engine did not use: runs recorded before the sampler read ``CUDA_VISIBLE_DEVICES``
    read all of the host's). ``why`` is kept in the record."""
    had = record.get("devices") or list(range(len(record["mj"][0]) if record["mj"] else 0))
    if not keep or any(k not in had for k in keep):
        raise NvmlError(f"GPUs {keep} to keep: expected some of the record's {had}")
    cols = [had.index(k) for k in keep]
    return {
        **record,
        "mj": [[row[c] for c in cols] for row in record["mj"]],
        "devices": keep,
        "devices_kept": why,
    }


def energy_between(record: dict, t0: float, t1: float) -> float | None:
    """Joules all GPUs used between monotonic times ``t0`` and ``t1`` (linear interpolation of
    the counters), or None when the readings do not cover the window."""
    ts, mj = record.get("t") or [], record.get("mj") or []
    if len(ts) < 2 or t0 < ts[0] or t1 > ts[-1] or t1 <= t0:
        return None
    return (_counter_at(ts, mj, t1) - _counter_at(ts, mj, t0)) / 1000.0


def _counter_at(ts: list[float], mj: list[list[int]], t: float) -> float:
    i = min(max(bisect_left(ts, t), 1), len(ts) - 1)
    f = (t - ts[i - 1]) / (ts[i] - ts[i - 1]) if ts[i] > ts[i - 1] else 0.0
    return sum(a + f * (b - a) for a, b in zip(mj[i - 1], mj[i], strict=True))
