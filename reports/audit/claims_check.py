"""What a claims file's selectors may name (``measure.a``, ``.b``, ``.baseline``) and their
check, and the files a computed metric's ``measure.params`` name, with the claims file's checker
(``devices.checker``): every error names the file, the claim and the key."""

from __future__ import annotations

import hashlib
from typing import Any

from db.lmc_axes import SWITCH_NAMES
from devices.checker import Checker

# what a selector may name: run columns, lmc's switches, gbm's trees
SELECTOR_KEYS = ("engine", "policy", "k", "block", "probes", "kv", "wq", "threads",
                 "prefill_attn", "kind", "ctx", "depth", "seed", "length", "device",
                 "device_class", "kv_budget", "predictor", *SWITCH_NAMES)
# computed metrics' params that name a file relative to the claims file (checks_trees)
FILE_PARAMS = ("trees",)


def _trees(check: Checker, value: Any, key: str) -> str:
    """A predictor file as runs label it: ``trees=`` and the start of its sha256."""
    path = check.path.parent / check.text(value, key)
    try:
        return "trees=" + hashlib.sha256(path.read_bytes()).hexdigest()[:8]
    except OSError as exc:
        raise check.fail(key, f"cannot read {path}: {exc.strerror or exc}") from None


def selector(check: Checker, value: Any, key: str) -> dict[str, list[Any]]:
    """A selector: each key a value or a list of values the runs must have."""
    table = check.table(value, key, set(SELECTOR_KEYS))
    out = {}
    for name, item in table.items():
        values = item if isinstance(item, list) else [item]
        if not values or any(isinstance(v, (dict, list)) for v in values):
            raise check.fail(f"{key}.{name}", "must be a value or a list of values")
        if name == "predictor":  # gbm's trees, a file relative to the claims file
            values = [_trees(check, v, f"{key}.{name}") for v in values]
        out[name] = values
    return out


def params(check: Checker, value: Any, key: str) -> dict[str, Any]:
    """A computed metric's params as given, each of ``FILE_PARAMS`` made a path relative to the
    claims file (which must be there)."""
    table = dict(check.table(value, key, set(value) if isinstance(value, dict) else set()))
    for name in FILE_PARAMS:
        if name in table:
            path = check.path.parent / check.text(table[name], f"{key}.{name}")
            if not path.is_file():
                raise check.fail(f"{key}.{name}", f"no such file: {path}")
            table[name] = str(path)
    return table
