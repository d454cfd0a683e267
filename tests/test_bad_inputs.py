"""The bad-input corpus (tests/bad_inputs/cases.yaml) through the CLI, in-process.

Why: a user's mistake must end in one line that names the file (or option) and the key, with
exit code 2, never a traceback and never a silent success. Each case is a command line, plus
the small files it needs (text, or a mapping merged into ``base.yaml``); the test runs them all
and lists every case that misbehaves, so a regression shows the whole picture at once.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import re
import shlex
import shutil
import traceback
from collections import Counter
from pathlib import Path

import pytest
import yaml

from simulator.cli import main

HERE = Path(__file__).resolve().parent / "bad_inputs"
REPO = HERE.parents[1]
SUBCOMMANDS = ("run", "sweep", "plot", "compare", "capacity", "plan", "timeline", "regress",
               "profile", "validate")  # fmt: skip


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        elif value == "DELETE":
            out.pop(key, None)
        else:
            out[key] = value
    return out


def _expand(text: str, tmp: Path) -> str:
    """Placeholders: {tmp}, {data}, {repo}, and {nest:N}, N nested brackets (too deep to parse)."""
    text = re.sub(r"\{nest:(\d+)\}", lambda m: "[" * int(m[1]) + "]" * int(m[1]), text)
    return text.replace("{tmp}", str(tmp)).replace("{data}", str(HERE)).replace("{repo}", str(REPO))


def _write_files(case: dict, tmp: Path, base: dict) -> None:
    """Copy a case's ``copy`` folders from the repo, then write its files: text as is
    (``hex:`` prefix for raw bytes), a mapping merged over base.yaml; then make its ``dirs``."""
    for dest, src in (case.get("copy") or {}).items():
        shutil.copytree(REPO / src, tmp / dest)
    for name, content in (case.get("files") or {}).items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == "DELETE":
            path.unlink()
        elif isinstance(content, dict):
            path.write_text(_expand(yaml.safe_dump(_merge(base, content), sort_keys=False), tmp))
        elif content.startswith("hex:"):
            path.write_bytes(bytes.fromhex(content[4:]))
        else:
            path.write_text(_expand(content, tmp))
    for name in case.get("dirs") or []:
        (tmp / name).mkdir(parents=True, exist_ok=True)


def run_case(case: dict, tmp: Path, base: dict) -> tuple[int | None, str]:
    """(exit code or None if an exception escaped, stderr + any traceback)."""
    _write_files(case, tmp, base)
    argv = [_expand(a, tmp) for a in shlex.split(case["argv"])]
    err, out = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(tmp)  # default results/ folders land in the case's own folder
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code = main(argv)
            except SystemExit as e:  # argparse's own errors
                code = e.code if isinstance(e.code, int) else 1
    except Exception:  # noqa: BLE001 - any escape is the failure this corpus looks for
        return None, err.getvalue() + traceback.format_exc()
    finally:
        os.chdir(cwd)
    return code, err.getvalue()


def problems(case: dict, code: int | None, err: str) -> list[str]:
    """What is wrong with one case's outcome (empty: it behaved)."""
    found = []
    if code is None or "Traceback" in err:
        found.append("traceback:\n" + err[-1500:])
    elif code != case.get("exit", 2):
        found.append(f"exit {code}, expected {case.get('exit', 2)}; stderr: {err.strip()[:300]}")
    words = [case["where"], case["key"], *case.get("words", [])]
    missing = [w for w in words if _expand(str(w), Path("")) not in err]
    if code is not None and missing:
        found.append(f"stderr lacks {missing}: {err.strip()[:400]}")
    return found


def load_cases() -> list[dict]:
    cases = yaml.safe_load((HERE / "cases.yaml").read_text())
    return [c for group in cases for c in group["cases"]] if cases else []


def test_every_bad_input_fails_cleanly_naming_file_and_key(tmp_path):
    base = yaml.safe_load((HERE / "base.yaml").read_text())
    cases = load_cases()
    failures = []
    for i, case in enumerate(cases):
        tmp = tmp_path / f"c{i}"
        tmp.mkdir()
        code, err = run_case(case, tmp, base)
        failures += [f"{case['id']}: {p}" for p in problems(case, code, err)]
    assert not failures, f"{len(failures)} of {len(cases)} cases misbehaved:\n" + "\n".join(
        failures
    )


def test_the_base_experiment_runs(tmp_path):
    """Control: base.yaml itself is valid, so each YAML case fails for its own change only."""
    code, err = run_case({"argv": f"run {HERE / 'base.yaml'} --quiet --out {tmp_path}/o"},
                         tmp_path, {})  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "o" / "summary.json").is_file()


def test_corpus_covers_every_subcommand_with_150_cases():
    cases = load_cases()
    ids = [c["id"] for c in cases]
    assert len(ids) == len(set(ids)), [i for i, n in Counter(ids).items() if n > 1]
    by_command = Counter(shlex.split(c["argv"])[0] for c in cases)
    assert set(by_command) == set(SUBCOMMANDS), by_command
    assert len(cases) >= 150, by_command


@pytest.mark.parametrize("field", ["id", "argv", "where", "key"])
def test_every_case_says_what_its_error_must_name(field):
    for case in load_cases():
        assert str(case.get(field, "")).strip(), (case.get("id"), field)
