"""Where a prompt step's launch time goes, one engine process at a time (needs vLLM + GPU).

Why: the host time of launching an eager prompt step is drawn per engine process (up to 1.5x
apart on one machine, steady within a process; `profiles.diag_launch`), and the engine core's
thread placement does not explain it (`profiles.thread_sampler`). This times isolated prompts
in one fresh engine and traces a few of them with vLLM's torch profiler, so that two processes'
traces can be set side by side: the same kernels launched more slowly (host speed), or other
kernels (a per-process choice: autotuning, the compile cache).

``python -m profiles.launch_trace MODEL_DIR --out DIR`` (one engine process, the model as its
``config.json`` declares it and a bf16 KV cache; start it again for another draw) writes
``DIR/launch.json``: per prompt size, the time to first token of ``--n`` prompts run one at a
time on the idle engine (``max_tokens`` 1, so one prefill step each: at 600 tokens, above the
largest CUDA graph and a few ms of GPU work for an 8B, it is the host's launch), and
``DIR/trace/``: vLLM's torch-profiler trace of ``--traced`` more 600-token prompts.

``python -m profiles.launch_trace --summary DIR ...`` (no GPU) prints, per run: the medians, and
from the trace the kernels launched (count, distinct names), the launch calls' count and mean
host time, and the host time of the launching thread's top-level torch ops; then which kernel
names differ between the runs.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

SIZES = (256, 600, 2048)  # in a piecewise graph, just above the largest graph, well above
TRACED = 600


async def run(model_dir: str, out: Path, n: int, traced: int, sampler: str | None) -> dict:
    from profiles import vllm_run

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    os.environ.update(vllm_run.serve_env(1, cfg))
    trace_dir = (out / "trace").resolve()
    engine = vllm_run.start_engine(model_dir, 1, {"profiler_config": _profiler_config(trace_dir)})
    try:
        facts = vllm_run.engine_facts(engine)
        client = vllm_run.Client(engine, cfg["vocab_size"], seed=os.getpid())
        await vllm_run.warm_up(engine, cfg["vocab_size"], facts)
        ttft = {size: await _ttfts(client, f"s{size}", size, n) for size in SIZES}
        sampled = await _sampled_ttfts(client, sampler, out, n) if sampler else []
        await engine.start_profile()
        traced_ttft = await _ttfts(client, "traced", TRACED, traced)
        await engine.stop_profile()
        await asyncio.sleep(5.0)  # the worker writes the trace after stop
    finally:
        engine.shutdown()
    return {
        "pid": os.getpid(),
        "facts": facts,
        "ttft_s": ttft,
        "sampled_ttft_s": sampled,
        "traced_ttft_s": traced_ttft,
    }


async def _sampled_ttfts(client, sampler: str, out: Path, n: int) -> list[float]:
    """``3 n`` more 600-token prompts with ``sampler`` (a command; ``{pid}``: the engine core's
    process, ``{out}``: the run folder, e.g. ``py-spy record --pid {pid} --rate 500
    --nonblocking --format raw -o {out}/pyspy.txt``) running beside them, stopped with SIGINT
    after. A sampler that does not stop the process at each sample leaves the steps as they
    are, which the torch profiler does not (its overhead makes every traced step ~60 ms)."""
    import shlex
    import signal
    import subprocess

    cmd = shlex.split(sampler.format(pid=engine_core_pid(), out=out))
    proc = subprocess.Popen(cmd)
    await asyncio.sleep(1.0)
    try:
        return await _ttfts(client, "sampled", TRACED, 3 * n)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


def engine_core_pid() -> int:
    """The pid of this process's vLLM engine core (a child vLLM retitles ``VLLM::EngineCore``)."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name():
            return child.pid
    raise SystemExit("no VLLM::EngineCore child process found")


def _profiler_config(trace_dir: Path):
    """vLLM's torch profiler writing to ``trace_dir`` (its fields printed if they differ from
    what this expects, so that a failed start says what the installed vLLM takes)."""
    import dataclasses

    from vllm.config import ProfilerConfig

    try:
        return ProfilerConfig(profiler="torch", torch_profiler_dir=str(trace_dir))
    except TypeError:
        print("ProfilerConfig fields:", [f.name for f in dataclasses.fields(ProfilerConfig)])
        raise


async def _ttfts(client, tag: str, size: int, n: int) -> list[float]:
    """Time to first token of ``n`` prompts of ``size`` tokens, one after another."""
    out = []
    for i in range(n):
        await client.request(f"{tag}/{i}", size, 1)
        rec = client.records[f"{tag}/{i}"]
        out.append(rec["times"][0][0] - rec["t_submit"])
    return out


def load_trace(run_dir: Path) -> list[dict] | None:
    """The events of the engine core's (the worker's, ``rank0``) trace under ``run_dir/trace``
    (beside it vLLM writes the frontend's, ``*.async_llm.*``); None where the run kept none."""
    files = sorted((run_dir / "trace").glob("rank0*.json*"))
    if not files:
        return None
    opener = gzip.open if files[0].suffix == ".gz" else open
    with opener(files[0], "rt") as f:
        return json.load(f)["traceEvents"]


def trace_summary(events: list[dict]) -> dict:
    """Kernels, launch calls and the launching thread's top-level op time of one trace."""
    kernels = Counter(e["name"] for e in events if e.get("cat") == "kernel")
    runtime = [e for e in events if e.get("cat") == "cuda_runtime" and "aunch" in e["name"]]
    by_tid = Counter(e["tid"] for e in runtime)
    tid = by_tid.most_common(1)[0][0] if by_tid else None
    ops = sorted((e for e in events if e.get("cat") == "cpu_op" and e.get("tid") == tid),
                 key=lambda e: e["ts"])  # fmt: skip
    top, end = 0.0, -1.0
    for e in ops:  # top level: not inside the previous top-level op's interval
        if e["ts"] >= end:
            top, end = top + e["dur"], e["ts"] + e["dur"]
    durs = [e["dur"] for e in runtime]
    return {
        "kernels": sum(kernels.values()),
        "kernel_names": kernels,
        "launch_calls": len(runtime),
        "launch_call_us_mean": float(np.mean(durs)) if durs else 0.0,
        "top_level_op_ms": top / 1e3,
    }


def sampled_leaves(path: Path) -> Counter:
    """Samples per innermost frame of a py-spy ``--format raw`` file, plain or gzipped
    (``frame;...;frame N`` lines; the line number dropped, so one function is one key)."""
    leaves: Counter = Counter()
    text = gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            leaves[stack.split(";")[-1].split(" (")[0].strip()] += int(count)
    return leaves


def summarize(dirs: list[Path]) -> None:
    names = {}
    for d in dirs:
        res = json.loads((d / "launch.json").read_text())
        med = {s: round(float(np.median(v)) * 1e3, 2) for s, v in res["ttft_s"].items()}
        print(f"{d} (pid {res['pid']}): TTFT median ms by prompt size {med}; traced "
              f"{[round(t * 1e3, 1) for t in res['traced_ttft_s']]}")  # fmt: skip
        spy = next((f for f in (d / "pyspy.txt", d / "pyspy.txt.gz") if f.is_file()), None)
        if spy and res.get("sampled_ttft_s"):
            leaves = sampled_leaves(spy)
            total, n = sum(leaves.values()), len(res["sampled_ttft_s"])
            print(f"  sampled: {n} prompts, TTFT median "
                  f"{np.median(res['sampled_ttft_s']) * 1e3:.1f} ms, {total} samples "
                  f"({total / n:.1f} a prompt); top frames:")  # fmt: skip
            for k, v in leaves.most_common(8):
                print(f"    {v / n:6.2f} a prompt  {k[:100]}")
        events = load_trace(d)
        if events is None:
            print(f"  {d}/trace: no trace file")
            continue
        t = trace_summary(events)
        names[d] = t.pop("kernel_names")
        print(f"  trace: {t}, {len(names[d])} distinct kernels")
    runs = list(names)
    for a, b in zip(runs, runs[1:], strict=False):
        only_a, only_b = names[a] - names[b], names[b] - names[a]
        print(f"kernels {a.name} - {b.name}: {sum(only_a.values())} launches only in the first, "
              f"{sum(only_b.values())} only in the second")  # fmt: skip
        for k, v in (only_a + only_b).most_common(8):
            print(f"  {v} x {k[:110]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help="MODEL_DIR (a run), or run folders with --summary")
    ap.add_argument("--out", help="run folder to write")
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--traced", type=int, default=3)
    ap.add_argument("--summary", action="store_true")
    ap.add_argument("--sampler", help="command run beside 3 x --n more 600-token prompts "
                    "({pid}: the engine core, {out}: the run folder)")  # fmt: skip
    a = ap.parse_args(argv)
    if a.summary:
        summarize([Path(p) for p in a.paths])
        return 0
    if not a.out or len(a.paths) != 1:
        ap.error("a run takes one MODEL_DIR and --out")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    res = asyncio.run(run(a.paths[0], out, a.n, a.traced, a.sampler))
    res["wall_s"] = time.time() - t0
    (out / "launch.json").write_text(json.dumps(res))
    print(f"{out}: {len(res['ttft_s'])} sizes in {res['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
