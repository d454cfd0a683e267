"""Subcommands of ``servesim`` that other packages provide (``profile``, ``validate``).

The simulator never imports the profiler: the profiler depends on the simulator, not the other way
round, and the simulator must run where the profiler's GPU stack is absent. Commands are declared
once, in ``pyproject.toml`` as the entry-point group `GROUP`::

    [project.entry-points."servesim.commands"]
    profile = "profiles.cli:main"

and found through the installed package's metadata; a source checkout whose install is missing or
older than its ``pyproject.toml`` (an editable install of another checkout) reads the same table
from the checkout's ``pyproject.toml``. Each entry names a ``main(argv) -> int`` function.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from pathlib import Path

from simulator.errors import ConfigError

#: the entry-point group external subcommands are declared in
GROUP = "servesim.commands"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def declared_commands() -> dict[str, str]:
    """name -> ``module:function`` of every external subcommand, the checkout's declaration
    first (it is the newer one when both exist), else the installed metadata's."""
    found = {ep.name: ep.value for ep in entry_points(group=GROUP)}
    if PYPROJECT.is_file():
        try:
            import tomllib
        except ImportError:  # Python 3.10: the installed metadata is the only source
            return found
        data = tomllib.loads(PYPROJECT.read_text())
        found.update(data.get("project", {}).get("entry-points", {}).get(GROUP, {}))
    return found


def run_command(name: str, argv: list[str]) -> int:
    """Run the external subcommand ``name`` with ``argv``; ConfigError when none is declared."""
    target = declared_commands().get(name)
    if target is None:
        raise ConfigError("servesim", name, f"no command {name!r} is installed ({GROUP})")
    module, _, func = target.partition(":")
    return getattr(importlib.import_module(module), func)(argv)
