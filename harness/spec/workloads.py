"""A spec's ``[[workload]]`` tables: the kinds, their axes and settings, and their validation.

Every kind has axes (crossed: a scalar or a list of values) and scalar settings, with defaults;
needle, ppl and decode workloads may name their own text (a filler file relative to the spec's
folder, a needle sentence and its question) instead of the built-in ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.errors import InputError
from harness.spec_check import SpecChecker
from harness.workloads.text import DEFAULT_NEEDLE, NeedleTemplate, TextFiller

# Per workload kind: its axes (crossed) and its scalar settings, with defaults (None = required).
WORKLOAD_AXES: dict[str, dict[str, Any]] = {
    "needle": {"ctx": None, "depth": [0.5], "seed": [0]},
    "ppl": {"length": None, "seed": [0]},
    "decode": {"ctx": None, "seed": [0]},
    "attn-bench": {"ctx": None, "heads": [16], "kv_heads": [8], "head_dim": [128]},
}
WORKLOAD_SETTINGS: dict[str, dict[str, Any]] = {
    "needle": {"max_new": 16},
    "ppl": {"text": None},  # None: optional, left out of the workload's parameters when absent
    "decode": {"max_new": 32},
    # layers: copies of the layer attended in turn (lmc attn-bench --layers), so the KV comes
    # from memory as in decode; None: optional, left out (one layer) so that runs keep their keys
    "attn-bench": {"runs": 5, "seed": 0, "layers": None},
}
# Per workload kind: its own text, set only where a spec wants it (a path to a plain-text filler
# file, relative to the spec's folder, instead of the built-in grammar; the needle sentence and
# its question, as harness.workloads.NeedleTemplate takes them).
WORKLOAD_TEXT: dict[str, tuple[str, ...]] = {
    "needle": ("filler", "needle", "question"), "ppl": ("filler",), "decode": ("filler",),
    "attn-bench": (),
}


@dataclass(frozen=True)
class WorkloadAxes:
    """One ``[[workload]]`` table: its kind, its axes (lists, crossed) and scalar settings."""

    kind: str
    axes: dict[str, list[Any]]
    settings: dict[str, Any]


def parse_workloads(check: SpecChecker, value: Any) -> list[WorkloadAxes]:
    """Validate the ``[[workload]]`` tables (at least one), in the file's order."""
    if value is None:
        raise check.fail("workload", "at least one [[workload]] table is required; kinds: "
                         + ", ".join(WORKLOAD_AXES))
    if not isinstance(value, list):
        raise check.fail("workload", "must be an array of tables ([[workload]])")
    result = []
    for index, table in enumerate(value):
        key = f"workload[{index}]"
        if not isinstance(table, dict):
            raise check.fail(key, "must be a table")
        kind = check.scalar(table.get("kind", ""), f"{key}.kind", "str")
        if kind not in WORKLOAD_AXES:
            raise check.fail(f"{key}.kind",
                             f"unknown kind {kind!r}; allowed: {', '.join(WORKLOAD_AXES)}")
        axes_spec, settings_spec = WORKLOAD_AXES[kind], WORKLOAD_SETTINGS[kind]
        check.table(table, key, {"kind", *axes_spec, *settings_spec, *WORKLOAD_TEXT[kind]})
        axes: dict[str, list[Any]] = {}
        for axis, default in axes_spec.items():
            if axis not in table and default is None:
                raise check.fail(f"{key}.{axis}", f"required for {kind} workloads")
            raw = table.get(axis, default)
            if axis == "depth":
                axes[axis] = check.axis(raw, f"{key}.{axis}", "float", low=0.0, high=1.0)
            else:
                low = 0 if axis == "seed" else 1
                axes[axis] = check.axis(raw, f"{key}.{axis}", "int", low=low)
        settings = {}
        for setting, default in settings_spec.items():
            if default is None:  # optional: left out of the workload's parameters when absent
                if setting not in table:
                    continue
                name = f"{key}.{setting}"
                settings[setting] = (
                    check.relative_file(table[setting], name) if setting == "text"
                    else check.minimum(check.scalar(table[setting], name, "int"), name, 1))
                continue
            low = 0 if setting == "seed" else 1
            settings[setting] = check.minimum(
                check.scalar(table.get(setting, default), f"{key}.{setting}", "int"),
                f"{key}.{setting}", low)
        settings.update(_workload_text(check, table, key, kind))
        if kind == "attn-bench":
            for heads, kv_heads in ((h, g) for h in axes["heads"] for g in axes["kv_heads"]):
                if heads % kv_heads:
                    raise check.fail(f"{key}.kv_heads",
                                     f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
        result.append(WorkloadAxes(kind=kind, axes=axes, settings=settings))
    return result


def _workload_text(check: SpecChecker, table: dict[str, Any], key: str,
                   kind: str) -> dict[str, str]:
    """The text settings a workload table sets away from the defaults, checked; left out when
    at the default, so that a workload keeps its identity (and its runs their keys)."""
    found: dict[str, str] = {}
    for name in WORKLOAD_TEXT[kind]:
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
