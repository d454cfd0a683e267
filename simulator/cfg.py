"""Small helpers to read validated values out of nested YAML dicts.

Every section reader (workload, model, engine, ...) uses these so that errors always name the
file, the full dotted key path and what was expected. Reading is strict: unknown keys are errors
(a typo must never be silently ignored).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from simulator.errors import ConfigError

REQUIRED = object()


class Section:
    """A view on one mapping of the config, remembering its file and key path.

    Reading a key marks it used; `done()` raises on any key that was never read (unknown key).
    """

    def __init__(self, data: Any, where: str, path: str = ""):
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(where, path or "<top>", f"expected a mapping, got {_show(data)}")
        self.data = data
        self.where = where
        self.path = path
        self._used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def error(self, name: str, message: str) -> ConfigError:
        return ConfigError(self.where, self.key(name), message)

    def has(self, name: str) -> bool:
        return name in self.data

    def raw(self, name: str, default: Any = REQUIRED) -> Any:
        self._used.add(name)
        if name not in self.data:
            if default is REQUIRED:
                raise self.error(name, "required key is missing")
            return default
        return self.data[name]

    def section(self, name: str, default: Any = REQUIRED) -> Section:
        value = self.raw(name, default)
        return Section(value, self.where, self.key(name))

    def num(
        self,
        name: str,
        default: Any = REQUIRED,
        *,
        min: float | None = None,
        max: float | None = None,
        strict_min: bool = False,
    ) -> float:
        """A finite number: YAML reads ``.nan`` and ``.inf`` as floats, and NaN passes every
        range comparison (no field takes an infinity for "no limit"; they use null)."""
        value = self.raw(name, default)
        if value is None and default is None:
            return None  # type: ignore[return-value]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(name, f"expected a number, got {_show(value)}{_exponent_hint(value)}")
        if not math.isfinite(value):
            raise self.error(name, f"expected a finite number, got {value}")
        _check_range(self, name, value, min, max, strict_min)
        return float(value)

    def int(
        self, name: str, default: Any = REQUIRED, *, min: int | None = None, max: int | None = None
    ) -> int:
        value = self.raw(name, default)
        if value is None and default is None:
            return None  # type: ignore[return-value]
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            hint = _exponent_hint(value, integer=True)
            raise self.error(name, f"expected an integer, got {_show(value)}{hint}")
        _check_range(self, name, value, min, max, False)
        return value

    def str(self, name: str, default: Any = REQUIRED, *, choices: Iterable[str] | None = None):
        value = self.raw(name, default)
        if value is None and default is None:
            return None
        if not isinstance(value, str):
            raise self.error(name, f"expected a string, got {_show(value)}")
        if choices is not None:
            choices = list(choices)
            if value not in choices:
                raise self.error(name, f"expected one of {', '.join(choices)}, got {value!r}")
        return value

    def bool(self, name: str, default: Any = REQUIRED) -> bool:
        value = self.raw(name, default)
        if not isinstance(value, bool):
            raise self.error(name, f"expected true or false, got {_show(value)}")
        return value

    def list(self, name: str, default: Any = REQUIRED, *, item: Callable | None = None) -> list:
        value = self.raw(name, default)
        if not isinstance(value, list):
            raise self.error(name, f"expected a list, got {_show(value)}")
        return value

    def done(self) -> None:
        """Raise on the first key that no reader asked for."""
        for name in self.data:
            if name not in self._used:
                raise self.error(str(name), "unknown key")


def _check_range(sec: Section, name: str, value, lo, hi, strict_lo: bool) -> None:
    if lo is not None and (value <= lo if strict_lo else value < lo):
        op = ">" if strict_lo else ">="
        raise sec.error(name, f"expected a number {op} {lo}, got {value}")
    if hi is not None and value > hi:
        raise sec.error(name, f"expected a number <= {hi}, got {value}")


def _show(value: Any) -> str:
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"


def _exponent_hint(value: Any, integer: bool = False) -> str:
    """YAML 1.1 (PyYAML) reads ``1e-3`` as text: say how to write the number it looks like."""
    if not isinstance(value, str) or "e" not in value.lower():
        return ""
    try:
        number = float(value)
    except ValueError:
        return ""
    if integer and number.is_integer():
        return f" (YAML reads {value} as text; write {int(number)})"
    mantissa, _, exponent = value.lower().partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    if exponent[:1] not in ("+", "-"):
        exponent = "+" + exponent
    ways = [f"{mantissa}e{exponent}"]  # YAML 1.1 wants the dot and the exponent's sign
    if _YAML_FLOAT.match(repr(number)):  # the plain form, where YAML reads it (1000.0, 0.001)
        ways.append(repr(number))
    return f" (YAML reads {value} as text; write {' or '.join(ways)})"


#: what YAML 1.1 (PyYAML) reads as a float: a dot always, a signed exponent if any
_YAML_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*\.[0-9_]*([eE][-+][0-9]+)?$")
