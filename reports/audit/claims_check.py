"""Checks of a claims file's values (reports.audit.claims_file): every error names the file, the
claim and the key."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

from db.lmc_axes import SWITCH_NAMES
from reports.errors import ReportInputError

# what a selector (measure.a, .b, .baseline) may name: run columns, lmc's switches, gbm's trees
SELECTOR_KEYS = ("engine", "policy", "k", "block", "probes", "kv", "wq", "threads",
                 "prefill_attn", "kind", "ctx", "depth", "seed", "length", "device",
                 "device_class", "kv_budget", "predictor", *SWITCH_NAMES)


class Check:
    """Validation of one claims file's values; every error names the file, where and key."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, key: str, message: str) -> ReportInputError:
        return ReportInputError(f"{self.path}: {where}: key '{key}': {message}")

    def table(self, value: Any, where: str, key: str, allowed: set[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, key, f"must be a table, got {type(value).__name__}")
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise self.fail(where, f"{key}.{unknown[0]}" if key else unknown[0],
                            f"unknown key; allowed: {', '.join(sorted(allowed))}")
        return value

    def text(self, value: Any, where: str, key: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(where, key, f"must be a non-empty string, got {value!r}")
        return value.strip()

    def number(self, value: Any, where: str, key: str, low: float | None = None) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(where, key, f"must be a number, got {value!r}")
        if not math.isfinite(value):  # nan passes every comparison, inf every bound
            raise self.fail(where, key, f"must be a finite number, got {value!r}")
        if low is not None and value < low:
            raise self.fail(where, key, f"must be >= {low:g}, got {value!r}")
        return float(value)

    def trees(self, value: Any, where: str, key: str) -> str:
        """A predictor file as runs label it: ``trees=`` and the start of its sha256."""
        path = self.path.parent / self.text(value, where, key)
        try:
            return "trees=" + hashlib.sha256(path.read_bytes()).hexdigest()[:8]
        except OSError as exc:
            raise self.fail(where, key, f"cannot read {path}: {exc.strerror or exc}") from None

    def selector(self, value: Any, where: str, key: str) -> dict[str, list[Any]]:
        table = self.table(value, where, key, set(SELECTOR_KEYS))
        out = {}
        for name, item in table.items():
            values = item if isinstance(item, list) else [item]
            if not values or any(isinstance(v, (dict, list)) for v in values):
                raise self.fail(where, f"{key}.{name}", "must be a value or a list of values")
            if name == "predictor":  # gbm's trees, a file relative to the claims file
                values = [self.trees(v, where, f"{key}.{name}") for v in values]
            out[name] = values
        return out
