"""Loading experiment YAMLs: files, ``--set`` overrides, and the top-level schema.

An experiment is a nested mapping (no flattened flags); each section is read strictly by the
module that owns it (``scheduler`` by the policy, ``workload`` by workloads.build, ...), so an
unknown key anywhere is an error naming the file and its dotted path.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from simulator.errors import ConfigError
from simulator.files import load_yaml_file, parse_yaml

TOP_LEVEL = (
    "name", "description", "seed", "model", "hardware", "scheduler", "kv_cache", "latency",
    "cluster", "workload", "slo", "sim", "output",
    # read by the experiment tooling (simulator/sweep.py, simulator/regress.py), not by a run:
    "sweep", "seeds", "regress",
)  # fmt: skip

# Keys that describe how to run an experiment (a grid, repeats, a CI subset) rather than one run.
TOOLING_KEYS = ("sweep", "seeds", "regress")


def load_yaml(path: str | Path) -> dict:
    """An experiment YAML as a dict, read strictly (UTF-8 text, no duplicate keys)."""
    data = load_yaml_file(path, "experiment YAML")
    if not isinstance(data, dict):
        raise ConfigError(str(path), "", "expected a mapping of experiment sections at top level")
    return data


def apply_overrides(config: dict, overrides: list[str], where: str = "--set") -> dict:
    """Apply ``a.b.c=value`` strings (value parsed as YAML) to a copy of ``config``."""
    out = copy.deepcopy(config)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(where, item, "expected KEY.PATH=VALUE")
        key, text = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(where, key, "expected a dotted key path like scheduler.max_num_seqs")
        try:
            value = parse_yaml(text, f"{where} {item}")
        except ConfigError as e:
            if "not valid YAML" not in e.message:
                raise
            value = text  # not YAML: the text itself (a string value needs no quotes)
        node: Any = out
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            elif not isinstance(nxt, dict):
                raise ConfigError(where, ".".join(parts[: i + 1]), "is not a mapping in the file")
            node = nxt
        node[parts[-1]] = value
    return out


@contextmanager
def blame_overrides(where: str, overrides: list[str] | None) -> Iterator[None]:
    """Re-raise a config error about a key that a ``--set`` gave as an error of that ``--set``.

    Why: the value came from the command line, so pointing at the YAML file would send the user
    looking for a line that is not there.
    """
    try:
        yield
    except ConfigError as e:
        raise _blamed(e, where, overrides or []) from None


def _blamed(error: ConfigError, where: str, overrides: list[str]) -> ConfigError:
    if error.where != where or not error.key:
        return error
    for item in reversed(overrides):
        key = item.split("=", 1)[0].strip()
        inside = error.key == key or error.key.startswith(key + ".")
        above = key.startswith(error.key + ".") and "unknown" in error.message
        if inside or above:
            return ConfigError(f"--set {item}", error.key, error.message)
    return error


def folder_name(config: dict, fallback: str) -> str:
    """The experiment's name as a results folder name: ``name:`` when it is a plain name (see
    `folder_name_problem`), else ``fallback`` (the file's stem), so a bad name never sends a failed
    run's files outside ``results/``."""
    name = config.get("name")
    return name if isinstance(name, str) and not folder_name_problem(name) else fallback


def folder_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a results folder (None when it can)."""
    if not name.strip() or name in (".", ".."):
        return "expected a non-empty name (it names the results folder)"
    if any(c in name for c in "/\\\0"):
        return (
            f"expected a plain name without '/' or '\\' (it names the results folder), got {name!r}"
        )
    return None
