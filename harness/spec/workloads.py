"""A spec's ``[[workload]]`` tables: each checked against its kind's axes and settings.

Every kind (harness.workloads.kinds) has axes (crossed: a scalar or a list of values) and
scalar settings, with defaults; a kind may take its own text (a filler file relative to the
spec's folder, a needle sentence and its question) instead of the built-in ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from devices.checker import Checker
from harness.errors import InputError
from harness.workloads.base import WorkloadKind
from harness.workloads.kinds import KINDS
from harness.workloads.text import DEFAULT_NEEDLE, NeedleTemplate, TextFiller


@dataclass(frozen=True)
class WorkloadAxes:
    """One ``[[workload]]`` table: its kind, its axes (lists, crossed) and scalar settings."""

    kind: str
    axes: dict[str, list[Any]]
    settings: dict[str, Any]


def parse_workloads(check: Checker, value: Any) -> list[WorkloadAxes]:
    """Validate the ``[[workload]]`` tables (at least one), in the file's order."""
    if value is None:
        raise check.fail("workload", "at least one [[workload]] table is required; kinds: "
                         + ", ".join(KINDS))
    if not isinstance(value, list):
        raise check.fail("workload", "must be an array of tables ([[workload]])")
    result = []
    for index, table in enumerate(value):
        key = f"workload[{index}]"
        if not isinstance(table, dict):
            raise check.fail(key, "must be a table")
        name = check.scalar(table.get("kind", ""), f"{key}.kind", "str")
        if name not in KINDS:
            raise check.fail(f"{key}.kind",
                             f"unknown kind {name!r}; allowed: {', '.join(KINDS)}")
        kind = KINDS[name]
        check.table(table, key, {"kind", *(a.name for a in kind.axes),
                                 *(s.name for s in kind.settings), *kind.texts})
        axes = _axes(check, table, key, kind)
        settings = _settings(check, table, key, kind)
        settings.update(_workload_text(check, table, key, kind))
        kind.check(check.fail, key, axes)
        result.append(WorkloadAxes(kind=name, axes=axes, settings=settings))
    return result


def _axes(check: Checker, table: dict[str, Any], key: str,
          kind: WorkloadKind) -> dict[str, list[Any]]:
    axes: dict[str, list[Any]] = {}
    for axis in kind.axes:
        if axis.name not in table and axis.default is None:
            raise check.fail(f"{key}.{axis.name}", f"required for {kind.name} workloads")
        axes[axis.name] = check.axis(table.get(axis.name, axis.default), f"{key}.{axis.name}",
                                     axis.type, low=axis.low, high=axis.high)
    return axes


def _settings(check: Checker, table: dict[str, Any], key: str,
              kind: WorkloadKind) -> dict[str, Any]:
    settings = {}
    for setting in kind.settings:
        name = f"{key}.{setting.name}"
        if setting.default is None:  # optional: left out of the workload's parameters when absent
            if setting.name not in table:
                continue
            settings[setting.name] = (
                check.relative_file(table[setting.name], name) if setting.type == "file"
                else check.minimum(check.scalar(table[setting.name], name, "int"), name,
                                   setting.low))
            continue
        settings[setting.name] = check.minimum(
            check.scalar(table.get(setting.name, setting.default), name, "int"), name,
            setting.low)
    return settings


def _workload_text(check: Checker, table: dict[str, Any], key: str,
                   kind: WorkloadKind) -> dict[str, str]:
    """The text settings a workload table sets away from the defaults, checked; left out when
    at the default, so that a workload keeps its identity (and its runs their keys)."""
    found: dict[str, str] = {}
    for name in kind.texts:
        value = check.scalar(table.get(name, ""), f"{key}.{name}", "str")
        if name == "filler" and value not in ("", "grammar"):
            value = str((check.path.parent / value).resolve())
            try:
                TextFiller(value)  # readable, UTF-8, holds sentences
            except InputError as exc:
                raise check.fail(f"{key}.{name}", str(exc)) from None
        if value not in ("", "grammar", getattr(DEFAULT_NEEDLE, name, None)):
            found[name] = value
    try:
        NeedleTemplate(needle=found.get("needle", DEFAULT_NEEDLE.needle),
                       question=found.get("question", DEFAULT_NEEDLE.question))
    except InputError as exc:
        raise check.fail(f"{key}.{'needle' if 'needle' in found else 'question'}", str(exc)
                         ) from None
    return found
