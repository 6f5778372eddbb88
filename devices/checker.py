"""The checker of every file a user writes: specs, claims files, inventories.

Each message names the file, where in it (a claim, a device; nothing for a spec, whose keys
are written from its top), the key, and what is wrong and what is allowed. The error is the
reader's own class (``InputError`` for a spec, ``ReportInputError`` for a claims file,
``InventoryError`` for an inventory), so each is the bad input its command line reports with
exit code 2. It lives here, beside the capped reader (``devices.files``), because devices is
the lowest layer every reader imports.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _quoted(key: str) -> str:
    """A key as specs and claims files name it: in single quotes, verbatim."""
    return f"'{key}'"


class Checker:
    """Checks of one file's values; every failure is ``error`` with a message that names the
    file, ``where`` in it and the key."""

    def __init__(self, path: Path, error: Callable[[str], Exception], what: str,
                 where: str = "", quote: Callable[[str], str] = _quoted) -> None:
        self.path = path
        self.error = error
        self.what = what  # what the file is: "spec", "claims file", "inventory"
        self.where = where
        self.quote = quote  # how a message writes a key (inventories: repr)

    def at(self, where: str) -> Checker:
        """The same checks of one part of the file (a claim, a row, a device)."""
        part = copy.copy(self)
        part.where = where
        return part

    def fail(self, key: str, message: str) -> Exception:
        where = f"{self.where}: " if self.where else ""
        return self.error(f"{self.path}: {where}key {self.quote(key)}: {message}")

    def table(self, value: Any, key: str, allowed: set[str]) -> dict[str, Any]:
        """A table whose keys are all ``allowed``; the first unknown one (sorted) is named."""
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a table, got {type(value).__name__}")
        unknown = sorted(set(value) - allowed)
        if unknown:
            prefix = f"{key}." if key else ""
            raise self.fail(prefix + unknown[0],
                            f"unknown key; allowed: {', '.join(sorted(allowed))}")
        return value

    def scalar(self, value: Any, key: str, kind: str) -> Any:
        """A value of ``kind`` ("int", "float", "str", "bool"); a float is made a float."""
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

    def number(self, value: Any, key: str, low: float | None = None) -> float:
        """A finite number, at least ``low``; the message shows the value as written."""
        number = self.scalar(value, key, "float")
        if low is not None:
            self.minimum(value, key, low)
        return number

    def text(self, value: Any, key: str) -> str:
        """A string with more than white space in it, stripped."""
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"must be a non-empty string, got {value!r}")
        return value.strip()

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
        """A text file named relative to the checked file's folder, as an absolute path."""
        given = self.scalar(value, key, "str")
        path = (self.path.parent / given).resolve()
        if not path.is_file():
            raise self.fail(key, f"{given!r} (resolved relative to the {self.what}'s folder to "
                            f"{path}) is not a file")
        return str(path)

    def converted(self, value: Any, key: str, convert: Callable[[Any], Any]) -> Any:
        """``convert(value)``, whose ValueError says what is expected instead."""
        try:
            return convert(value)
        except ValueError as exc:
            raise self.fail(key, f"got {value!r}, expected {exc}") from None
