"""Find the files an experiment YAML names (traces, length tables).

Why a search order: an experiment YAML should work from any current directory and from a copy of
the repository, and the shipped traces (``workloads/traces/...``) should be reachable by the same
short path from every YAML. Relative paths are tried against, in order:

1. the folder of the experiment YAML (``base_dir``),
2. the current directory,
3. the repository root (the parent folder of the ``workloads`` package).

The first existing file wins. A missing file is a ``ConfigError`` that names the key and every
path tried. Absolute paths (and ``~``) are used as they are.
"""

from __future__ import annotations

from pathlib import Path

from simulator.cfg import Section

REPO_ROOT = Path(__file__).resolve().parent.parent


def candidate_paths(text: str, base_dir: Path) -> list[Path]:
    """The paths tried for ``text``, in order, without duplicates."""
    path = Path(text).expanduser()
    if path.is_absolute():
        return [path]
    out: list[Path] = []
    for root in (Path(base_dir), Path.cwd(), REPO_ROOT):
        candidate = root / path
        if candidate not in out:
            out.append(candidate)
    return out


def resolve_file(sec: Section, name: str, base_dir: Path) -> tuple[str, Path]:
    """Read key ``name`` of ``sec`` as a file path; return (path as written, existing path)."""
    text = sec.str(name)
    if not text.strip():
        raise sec.error(name, "expected a file path, got an empty string")
    tried = candidate_paths(text, base_dir)
    for path in tried:
        if path.is_file():
            return text, path
    shown = ", ".join(str(p) for p in tried)
    raise sec.error(name, f"file {text!r} not found; tried {shown}")
