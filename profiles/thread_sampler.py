"""Where the engine's threads run, sampled beside a run on the GPU machine (no vLLM needed).

Why: a prompt step's eager launch is host work, and its median differs by up to 50% between
engine processes on one machine (`profiles.diag_launch`), steady within each. One suspect is
placement: the engine core's main thread sharing a physical core (a hyperthread sibling, or the
same logical CPU) with another busy thread of the frontend or of the engine. This sampler records
what that needs and nothing else.

``python -m profiles.thread_sampler OUT.txt [--every 0.1]`` writes, until killed:

* a header: ``TOPO cpu=<n> core=<physical core id> pkg=<package>`` per logical CPU, and
  ``GPU_AFFINITY <nvidia-smi topo -m's CPU affinity>`` when that command answers;
* every ``--every`` seconds: ``T <time.monotonic()>`` (the engine's step clock), then one line
  ``<pid> <tid> <cpu> <ticks> <comm>`` per thread of a python process (or one vLLM retitled
  ``VLLM::EngineCore``) that used CPU since the previous sample (``ticks``: utime + stime
  advanced, in clock ticks; ``cpu``: the logical CPU it last ran on).

``python -m profiles.thread_sampler --summary FILE[.gz] ...`` reads such files back and prints,
per engine core's main thread: the samples it was busy in, the CPUs it ran on, how often it
moved, and in how many samples another thread busy for 3+ ticks ran on the same logical CPU.

Reading a thread's ``stat`` is racy by nature (a thread can end between listing and reading):
such threads are skipped, which loses at most one sample of a dying thread.
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path


def topology() -> list[str]:
    lines = []
    for cpu_dir in sorted(
        Path("/sys/devices/system/cpu").glob("cpu[0-9]*"), key=lambda p: int(p.name[3:])
    ):
        topo = cpu_dir / "topology"
        try:
            core = (topo / "core_id").read_text().strip()
            pkg = (topo / "physical_package_id").read_text().strip()
        except OSError:
            continue
        lines.append(f"TOPO cpu={cpu_dir.name[3:]} core={core} pkg={pkg}")
    return lines


def gpu_affinity() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        if line.startswith("GPU0"):
            return " ".join(line.split()[1:])
    return None


def python_pids() -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            head = (p / "cmdline").read_bytes()[:200]
            if b"python" in head or b"VLLM" in head:  # vLLM retitles its engine processes
                pids.append(int(p.name))
        except OSError:
            continue
    return pids


def thread_stats(pid: int) -> list[tuple[int, str, int, int]]:
    """(tid, comm, cpu, utime + stime) for each readable thread of ``pid``."""
    rows = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return rows
    for tid in tids:
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")].replace(" ", "_")
        fields = raw[raw.rindex(")") + 2 :].split()  # fields[0] is stat field 3 (state)
        rows.append((int(tid), comm, int(fields[36]), int(fields[11]) + int(fields[12])))
    return rows


def sample_forever(out, every: float) -> None:
    last: dict[int, int] = {}
    while True:
        lines = [f"T {time.monotonic():.4f}"]
        seen = {}
        for pid in python_pids():
            for tid, comm, cpu, ticks in thread_stats(pid):
                seen[tid] = ticks
                used = ticks - last.get(tid, ticks)
                if used > 0:
                    lines.append(f"{pid} {tid} {cpu} {used} {comm}")
        last = seen
        out.write("\n".join(lines) + "\n")
        out.flush()
        time.sleep(every)


def read_samples(path: str) -> list[list[tuple[int, int, int, int, str]]]:
    """The samples of a sampler file: per sample, (pid, tid, cpu, ticks, comm) of each thread."""
    opener = gzip.open if path.endswith(".gz") else open
    samples: list[list[tuple[int, int, int, int, str]]] = []
    with opener(path, "rt") as f:
        for line in f:
            if line.startswith("T "):
                samples.append([])
            elif samples and not line.startswith(("TOPO", "GPU_AFFINITY")):
                pid, tid, cpu, ticks, comm = line.split(maxsplit=4)
                samples[-1].append((int(pid), int(tid), int(cpu), int(ticks), comm.strip()))
    return samples


def placement(samples, engine_pid: int) -> dict:
    """Where the engine core's main thread (tid == pid) ran, and beside whom (module doc)."""
    busy, shared, moves, last = 0, 0, 0, None
    cpus: Counter = Counter()
    for rows in samples:
        mine = [r for r in rows if r[1] == engine_pid]
        if not mine:
            continue
        cpu = mine[0][2]
        busy, cpus[cpu] = busy + 1, cpus[cpu] + 1
        moves += last is not None and cpu != last
        last = cpu
        shared += any(r[2] == cpu and r[1] != engine_pid and r[3] >= 3 for r in rows)
    return {
        "busy_samples": busy,
        "cpus": dict(cpus.most_common()),
        "moves": moves,
        "shared_cpu_samples": shared,
    }


def summarize(path: str) -> None:
    samples = read_samples(path)
    engines = sorted(
        {r[0] for rows in samples for r in rows if r[0] == r[1] and r[4].startswith("VLLM::Engine")}
    )
    print(f"{path}: {len(samples)} samples, {len(engines)} engine core process(es)")
    for pid in engines:
        print(f"  engine core {pid}: {placement(samples, pid)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="+", help="file to write (or, with --summary, files to read)")
    ap.add_argument("--every", type=float, default=0.1)
    ap.add_argument("--summary", action="store_true")
    a = ap.parse_args(argv)
    if a.summary:
        for path in a.out:
            summarize(path)
        return 0
    if len(a.out) != 1:
        ap.error("sampling writes one file")
    a.out = a.out[0]
    with open(a.out, "w") as out:
        out.write("\n".join(topology()) + "\n")
        aff = gpu_affinity()
        if aff:
            out.write(f"GPU_AFFINITY {aff}\n")
        try:
            sample_forever(out, a.every)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
