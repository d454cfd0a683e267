"""Reading users' files and checking output folders, with errors that name the file.

Why one module: every input format (experiment YAML, traces, length tables, profile tables,
tolerance files) must fail the same way on a file that is missing, a folder, unreadable, binary
or not UTF-8: one `ConfigError` naming the file and what was expected, never a
``UnicodeDecodeError`` traceback. YAML is read strictly: a key given twice in one mapping is an
error naming the key and both lines (PyYAML keeps the last value without a word).
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from simulator.errors import ConfigError


def read_text(path: str | Path, what: str = "file") -> str:
    """The whole file as UTF-8 text (a leading BOM dropped); ConfigError when it is not one."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(str(path), "", f"is a folder, not a file ({what} expected)")
    if not p.exists():
        raise ConfigError(str(path), "", f"file not found ({what} expected)")
    if not p.is_file():  # a device or pipe (/dev/zero) would be read forever
        raise ConfigError(str(path), "", f"not a regular file (a device or pipe; {what} expected)")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError(str(path), "", f"cannot read the file ({e.strerror})") from None
    return decode_text(data, str(path), what)


def csv_records(path: str | Path, what: str, columns) -> Iterator[tuple[int, dict]]:
    """``(line, row)`` of a CSV table whose header must hold ``columns`` (else a ConfigError
    naming the file), ``line`` as an editor numbers it (the header is line 1), so that a reader
    can name the line of a bad value."""
    reader = csv.DictReader(io.StringIO(read_text(path, what), newline=""))
    refuse_repeated_columns(path, reader.fieldnames)
    missing = [c for c in columns if c not in (reader.fieldnames or [])]
    if missing:
        raise ConfigError(str(path), "header", f"missing columns {missing}")
    return enumerate(reader, start=2)


def refuse_repeated_columns(path: str | Path, header: list[str] | None) -> None:
    """A ConfigError naming ``path`` and a column its CSV header names twice: a row dict keeps
    the last of the two values silently."""
    name = repeated_column(header or [])
    if name is not None:
        raise ConfigError(str(path), "header", f"column {name!r} is named twice; keep one")


def repeated_column(header: list[str]) -> str | None:
    """The first non-empty column name ``header`` gives twice, or None (empty names, from
    trailing commas, are never read, so they cannot be confused)."""
    seen: set[str] = set()
    for name in header:
        if name and name in seen:
            return name
        seen.add(name)
    return None


def decode_text(data: bytes, where: str, what: str = "file") -> str:
    """``data`` as UTF-8; a binary or otherwise encoded file names its first bad byte's line."""
    if b"\x00" in data[:8192]:
        raise ConfigError(where, "", f"looks like a binary (or UTF-16) file, not a text {what} "
                          "in UTF-8")  # fmt: skip
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(
            where,
            f"line {line}",
            f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
            f"save the {what} as UTF-8",
        ) from None


def parse_yaml(text: str, where: str) -> Any:
    """YAML text to Python data, refusing duplicate keys; errors name ``where`` and the line."""
    try:
        return _load_checked(text, where)
    except RecursionError:
        raise ConfigError(
            where, "", "not readable: nested too deeply (hundreds of levels)"
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(where, "", f"not valid YAML{at}: {getattr(e, 'problem', e)}") from None


def _load_checked(text: str, where: str) -> Any:
    """``yaml.safe_load(text)`` with the composed tree checked for duplicate keys before it is
    constructed, by the same loader: the text is parsed once (composing it apart and then
    loading it cost a second parse, ~0.02 s a run for a latency table's meta.yaml)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_duplicates(node, where, "", {})
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_yaml_file(path: str | Path, what: str = "YAML file") -> Any:
    """`read_text` + `parse_yaml`."""
    return parse_yaml(read_text(path, what), str(path))


def _check_duplicates(node: yaml.Node, where: str, path: str, open_nodes: dict) -> None:
    """Walk a composed YAML tree; a key repeated in one mapping raises, naming both lines, and
    so does an alias inside the node it names (``&a [*a]``: a value that contains itself,
    which no reader can walk)."""
    state = open_nodes.get(id(node))  # None: not seen; "open": on the path here; "done"
    if state == "open":
        line = node.start_mark.line + 1
        raise ConfigError(where, path or "<top>", f"the value (line {line}) contains itself "
                          "through a YAML alias")  # fmt: skip
    if isinstance(node, yaml.CollectionNode) and state is None:  # "done": checked already
        open_nodes[id(node)] = "open"
        _check_children(node, where, path, open_nodes)
        open_nodes[id(node)] = "done"


def _check_children(node: yaml.CollectionNode, where: str, path: str, open_nodes: dict) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else None
            if key is not None and key != "<<":
                dotted = f"{path}.{key}" if path else key
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise ConfigError(
                        where,
                        dotted,
                        f"duplicate key: given at line {seen[key]} and again at line {line} "
                        "(YAML would silently keep the last one)",
                    )
                seen[key] = line
            child = f"{path}.{key}" if path and key else (key or path)
            _check_duplicates(key_node, where, path, open_nodes)
            _check_duplicates(value_node, where, child, open_nodes)
    else:
        for i, item in enumerate(node.value):
            _check_duplicates(item, where, f"{path}[{i}]", open_nodes)


def check_out_dir(path: str | Path, option: str = "--out") -> Path:
    """Create the output folder now, before any work, so a bad ``--out`` fails in a second.

    Refused: an existing file, a folder under a file, a place that cannot be written.
    """
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(option, str(path), "is a file; expected a folder for the results")
    for parent in p.parents:
        if parent.exists() and not parent.is_dir():
            raise ConfigError(
                option, str(path), f"{parent} is a file, so no folder can be made under it"
            )
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(option, str(path), f"cannot create the folder ({e.strerror})") from None
    if not os.access(p, os.W_OK):
        raise ConfigError(option, str(path), "the folder is not writable")
    return p


def check_out_file(path: str | Path, option: str = "--out") -> Path:
    """An output file's folder exists (or is made) and the file itself is not a folder."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(option, str(path), "is a folder; expected a file name")
    check_out_dir(p.parent if str(p.parent) else Path("."), option)
    return p


class DuplicateKey(Exception):
    """A JSON object gave ``key`` twice (`loads_json_unique`); its caller names the file."""

    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """``object_pairs_hook``: the object as a dict, unless a key repeats (json would keep the
    last silently; YAML configs refuse duplicates too, `parse_yaml`). It made the parse of a
    100k-row trace ~8% slower (0.45 -> 0.49 s)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def loads_json_unique(text: str) -> Any:
    """``json.loads`` refusing a key given twice in an object (raises `DuplicateKey`)."""
    return json.loads(text, object_pairs_hook=_unique_keys)
