"""The checker every section of a spec is validated with (``harness.spec``,
``harness.spec.workloads``, and each engine's section in ``harness.engines``): each message
names the file and the key, and what is allowed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from harness.errors import InputError


class SpecChecker:
    """Validation helpers that prefix every message with the file and the key."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, key: str, message: str) -> InputError:
        return InputError(f"{self.path}: key '{key}': {message}")

    def table(self, value: Any, key: str, allowed: set[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a table, got {type(value).__name__}")
        unknown = sorted(set(value) - allowed)
        if unknown:
            prefix = f"{key}." if key else ""
            raise self.fail(prefix + unknown[0],
                            f"unknown key; allowed: {', '.join(sorted(allowed))}")
        return value

    def scalar(self, value: Any, key: str, kind: str) -> Any:
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.fail(key, f"must be an integer, got {value!r}")
        elif kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self.fail(key, f"must be a number, got {value!r}")
            if not math.isfinite(value):  # nan passes every range check; inf never ends
                raise self.fail(key, f"must be a finite number, got {value!r}")
            value = float(value)
        elif kind == "str":
            if not isinstance(value, str):
                raise self.fail(key, f"must be a string, got {value!r}")
        elif kind == "bool":
            if not isinstance(value, bool):
                raise self.fail(key, f"must be true or false, got {value!r}")
        return value

    def minimum(self, value: Any, key: str, low: float, high: float | None = None) -> Any:
        if value < low:
            raise self.fail(key, f"must be >= {low:g}, got {value!r}")
        if high is not None and value > high:
            raise self.fail(key, f"must be <= {high:.15g}, got {value!r}")
        return value

    def axis(self, value: Any, key: str, kind: str, low: float | None = None,
             choices: tuple[str, ...] | None = None, high: float | None = None) -> list[Any]:
        """A scalar or a non-empty list of distinct values, each checked."""
        values = value if isinstance(value, list) else [value]
        if not values:
            raise self.fail(key, "must not be an empty list")
        checked = []
        for item in values:
            item = self.scalar(item, key, kind)
            if choices is not None and item not in choices:
                raise self.fail(key, f"unknown value {item!r}; allowed: {', '.join(choices)}")
            if low is not None and item < low:
                raise self.fail(key, f"values must be >= {low:g}, got {item!r}")
            if high is not None and item > high:
                raise self.fail(key, f"values must be <= {high:.15g}, got {item!r}")
            if item in checked:
                raise self.fail(key, f"value {item!r} is listed twice")
            checked.append(item)
        return checked

    def relative_file(self, value: Any, key: str) -> str:
        """A text file named relative to the spec's folder, as an absolute path."""
        given = self.scalar(value, key, "str")
        path = (self.path.parent / given).resolve()
        if not path.is_file():
            raise self.fail(key, f"{given!r} (resolved relative to the spec's folder to {path}) "
                            "is not a file")
        return str(path)
