"""The thread sampler's parsing and its placement summary, on a hand-written file."""

import os
import threading

from profiles import thread_sampler

SAMPLE = """TOPO cpu=0 core=0 pkg=0
TOPO cpu=1 core=1 pkg=0
GPU_AFFINITY X 0-1 0 N/A
T 1.0
10 10 0 10 VLLM::EngineCor
9 9 1 4 python3
T 1.1
10 10 0 10 VLLM::EngineCor
9 9 0 3 python3
T 1.2
9 9 1 5 python3
T 1.3
10 10 1 9 VLLM::EngineCor
10 11 1 2 ZMQbg/IO/0
"""


def test_placement_counts_moves_and_shared_cpu(tmp_path):
    path = tmp_path / "thr.txt"
    path.write_text(SAMPLE)
    samples = thread_sampler.read_samples(str(path))
    assert len(samples) == 4 and samples[2] == [(9, 9, 1, 5, "python3")]
    # busy in samples 1, 2 and 4; moved 0 -> 1 once; only sample 2 had another thread busy
    # for 3+ ticks on its CPU (the ZMQ thread's 2 ticks on CPU 1 are below that)
    assert thread_sampler.placement(samples, 10) == {
        "busy_samples": 3,
        "cpus": {0: 2, 1: 1},
        "moves": 1,
        "shared_cpu_samples": 1,
    }


def test_thread_stats_reads_this_process():
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, name="sampler test")
    worker.start()
    try:
        rows = thread_sampler.thread_stats(os.getpid())
    finally:
        stop.set()
        worker.join()
    tids = {r[0] for r in rows}
    assert os.getpid() in tids and worker.native_id in tids
    assert all(r[2] >= 0 and r[3] >= 0 for r in rows)
    assert thread_sampler.thread_stats(-1) == []
