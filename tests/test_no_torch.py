"""The simulator must run without torch: torch is only for profiling and real-GPU execution."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CODE = """
import sys
class Block:  # make any torch import fail loudly
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch imported by the simulator")
sys.meta_path.insert(0, Block())
import simulator.cli, simulator.runner, policies, workloads.build, profiles, profiles.cli
import profiles.validate, profiles.real_executor, profiles.step_batch, simulator.latency.profiled
from simulator.runner import build, simulate
cfg = {
    "model": "llama-3-8b", "hardware": {"gpu": "h200"}, "scheduler": {"policy": "continuous"},
    "workload": {"arrival": {"process": "poisson", "rate_per_s": 5},
                 "lengths": {"input": {"dist": "fixed", "value": 500},
                             "output": {"dist": "fixed", "value": 50}},
                 "num_requests": 50},
}
res = simulate(build(cfg, "inline", REPO))
assert res.summary["requests"]["completed"] == 50
assert res.summary["latency_model"]["name"].startswith("profile:h200/llama-3-8b")
assert "torch" not in sys.modules
print("ok")
"""


def test_simulator_runs_with_torch_unimportable():
    code = f"from pathlib import Path\nREPO = Path({str(REPO)!r})\n" + CODE
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")


VALIDATE = """
import sys
class Block:  # make any torch import fail, as on a machine without torch
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("no torch here")
sys.meta_path.insert(0, Block())
from simulator.cli import main
cfg = str(REPO / "validation/configs/val_static.yaml")
sets = ["--set", "workload.arrival.rate_per_s=5", "--set", "workload.num_requests=80"]
real = ["--real-json", str(REPO / "validation/static_heavy/real.json.gz")]
assert main(["validate", cfg, *sets, *real, "--out", OUT + "/a"]) == 0  # report: no torch needed
assert main(["validate", cfg, "--out", OUT + "/b"]) == 2  # GPU phase: a clear error, exit 2
print("ok")
"""


def test_validate_reports_from_a_stored_real_run_without_torch(tmp_path):
    head = f"from pathlib import Path\nREPO = Path({str(REPO)!r})\nOUT = {str(tmp_path)!r}\n"
    proc = subprocess.run(
        [sys.executable, "-c", head + VALIDATE], capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")
    assert "torch is not installed" in proc.stderr and "--real-json" in proc.stderr
    assert "Traceback" not in proc.stderr
