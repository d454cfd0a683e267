"""`profiles.launch_trace`'s reading of a torch-profiler trace, on hand-built events."""

from profiles.launch_trace import trace_summary


def test_launch_trace_summary_counts_kernels_launches_and_top_level_ops():
    events = [
        {"cat": "cpu_op", "tid": 1, "ts": 0, "dur": 100, "name": "aten::linear"},
        {"cat": "cpu_op", "tid": 1, "ts": 10, "dur": 50, "name": "aten::mm"},  # nested
        {"cat": "cpu_op", "tid": 1, "ts": 200, "dur": 30, "name": "aten::add"},
        {"cat": "cpu_op", "tid": 2, "ts": 0, "dur": 999, "name": "other thread"},
        {"cat": "cuda_runtime", "tid": 1, "ts": 20, "dur": 4, "name": "cudaLaunchKernel"},
        {"cat": "cuda_runtime", "tid": 1, "ts": 210, "dur": 6, "name": "cudaLaunchKernel"},
        {"cat": "cuda_runtime", "tid": 1, "ts": 220, "dur": 1, "name": "cudaStreamSynchronize"},
        {"cat": "kernel", "tid": 7, "ts": 30, "dur": 9, "name": "gemm"},
        {"cat": "kernel", "tid": 7, "ts": 230, "dur": 9, "name": "add"},
    ]
    got = trace_summary(events)
    assert got["kernels"] == 2 and got["launch_calls"] == 2
    assert got["launch_call_us_mean"] == 5.0 and got["top_level_op_ms"] == 0.13


def test_sampled_leaves_sums_samples_per_innermost_function(tmp_path):
    from profiles.launch_trace import sampled_leaves

    raw = tmp_path / "pyspy.txt"
    raw.write_text(
        "MainThread;run (a.py:3);forward (m.py:10) 5\n"
        "MainThread;run (a.py:3);forward (m.py:12) 2\n"
        "MainThread;run (a.py:3) 1\n"
        "garbage\n"
    )
    assert sampled_leaves(raw) == {"forward": 7, "run": 1}
