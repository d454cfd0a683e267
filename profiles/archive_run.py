"""Archive a vLLM run folder (what `device_vllm.sh` packs) into the compact form tables and
validation runs keep in git: ``python -m profiles.archive_run RUN_DIR DEST``.

What moves, and why each file is kept:

* ``engine.json`` and ``log.txt``: the engine's effective config and its log (the table build
  reads the weights it loaded and the kernels it selected from the log);
* ``steps.jsonl.<pid>`` of every engine-core process -> one ``steps.jsonl.0.gz``, rows in
  completion order (`read_steps` reads either form);
* ``energy.<pid>.jsonl`` -> ``energy.json.gz``, the merged record `read_energy` returns
  (``--energy-gpus``: only the GPUs the engine ran on, for a run that read every GPU);
* a profile phase -> ``profile.json.gz``; a run cut short keeps the scenarios it finished and
  says so (``cut_short: true``), so a table built from it can report its missing scenarios.
  Each profiling request keeps its first token's time only (``first_token_only: true``): the
  table reads nothing later (`profiles.vllm_table.frontend_delays`), and a three-pass grid's
  every token is 4.8 MB a table, which the lent GPU machine's 64 MiB carry could not hold;
* a replay's per-case ``<case>.json.gz`` files, unchanged.

Nothing is dropped silently: a run folder with neither steps nor a phase file is an error.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
from pathlib import Path

from profiles.gpu_energy import NvmlError, keep_devices, read_energy
from profiles.vllm_steps import read_steps
from profiles.vllm_table import load_profile_phase
from simulator.errors import ConfigError


def _write_gz_json(path: Path, obj) -> None:
    with gzip.open(path, "wt") as f:
        json.dump(obj, f)


def first_token_only(phase: dict) -> dict:
    """A profile phase whose requests keep only their first token's time (module docstring)."""
    reqs = {k: {**r, "times": r.get("times", [])[:1]} for k, r in phase["requests"].items()}
    return {**phase, "requests": reqs, "first_token_only": True}


def archive(run_dir: Path, dest: Path, energy_gpus: list[int] | None = None) -> list[str]:
    """Copy ``run_dir``'s run into ``dest`` (created); returns the names written.
    ``energy_gpus``: keep only these GPUs' energy counters (`gpu_energy.keep_devices`)."""
    run_dir, dest = Path(run_dir), Path(dest)
    if not (run_dir / "engine.json").is_file():
        raise ConfigError(
            str(run_dir),
            "engine.json",
            "missing: expected a vLLM run folder (what device_vllm.sh writes)",
        )
    steps = read_steps(str(run_dir / "steps.jsonl"))
    if not steps:
        raise ConfigError(
            str(run_dir), "steps.jsonl.*", "missing: expected the engine's step records"
        )
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for name in ("engine.json", "log.txt"):
        if (run_dir / name).is_file():
            shutil.copyfile(run_dir / name, dest / name)
            written.append(name)
    with gzip.open(dest / "steps.jsonl.0.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in steps)
    written.append("steps.jsonl.0.gz")
    energy = read_energy(run_dir)
    if energy is not None and energy_gpus is not None:
        try:
            energy = keep_devices(energy, energy_gpus, f"archive_run --energy-gpus {energy_gpus}")
        except NvmlError as e:
            raise ConfigError(str(run_dir / "energy.*.jsonl"), "devices", str(e)) from None
    if energy is not None:
        _write_gz_json(dest / "energy.json.gz", energy)
        written.append("energy.json.gz")
    if (run_dir / "profile.json.gz").is_file() or (run_dir / "profile.partial.jsonl").is_file():
        _write_gz_json(dest / "profile.json.gz", first_token_only(load_profile_phase(run_dir)))
        written.append("profile.json.gz")
    for case in sorted(run_dir.glob("*.json.gz")):
        if case.name not in ("profile.json.gz", "energy.json.gz"):
            shutil.copyfile(case, dest / case.name)
            written.append(case.name)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("dest", type=Path)
    ap.add_argument(
        "--energy-gpus",
        help="comma-separated NVML indices of the GPUs the engine ran on, for a run whose "
        "energy sampler read every GPU of the host (recorded before it read CUDA_VISIBLE_DEVICES)",
    )
    args = ap.parse_args(argv)
    try:
        gpus = _gpu_list(args.energy_gpus)
        names = archive(args.run_dir, args.dest, gpus)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.dest}: {', '.join(names)}")
    return 0


def _gpu_list(text: str | None) -> list[int] | None:
    if text is None:
        return None
    parts = [x.strip() for x in text.split(",")]
    if not all(x.isdigit() for x in parts):
        raise ConfigError("--energy-gpus", "value", f"expected indices like 0 or 0,1, got {text!r}")
    return [int(x) for x in parts]


if __name__ == "__main__":
    sys.exit(main())
