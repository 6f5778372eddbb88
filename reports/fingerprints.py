"""Flags from the device fingerprints taken before and after a run.

The fingerprint is a JSON document written by ``devices`` (governor per CPU, frequencies,
temperatures, load ...). Reports only need a few facts from it, so they are found by key name
wherever they sit in the document: a missing fact raises no flag.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

HOT_CELSIUS = 85.0  # RK3588 starts throttling around 85 degrees C


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key path, leaf value) for every leaf of a JSON document."""
    if isinstance(node, dict):
        for key in sorted(node, key=str):
            yield from _walk(node[key], f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _walk(item, f"{path}[{index}]")
    else:
        yield path, node


def _leaves(fingerprint: dict | None, word: str) -> list[tuple[str, Any]]:
    if not fingerprint:
        return []
    return [(path, value) for path, value in _walk(fingerprint) if word in path.lower()]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def fingerprint_flags(before: dict | None, after: dict | None) -> list[str]:
    """Flags for a run: non-performance governor, throttling, high temperature, a loaded machine."""
    flags: list[str] = []
    governors = sorted({str(v) for snap in (before, after) for _, v in _leaves(snap, "governor")
                        if isinstance(v, str) and v})
    others = [g for g in governors if g != "performance"]
    if others:
        flags.append("governor " + "/".join(others))
    for snap in (before, after):
        for _path, value in _leaves(snap, "throttl"):
            if value is True or (_number(value) or 0) > 0:
                flags.append("throttled")
                break
    temps = [t for snap in (before, after) for path, v in _leaves(snap, "temp")
             if (t := _number(v)) is not None]
    # Temperatures come in degrees or in millidegrees (sysfs); normalise to degrees.
    temps = [t / 1000.0 if t > 1000 else t for t in temps]
    if temps and max(temps) >= HOT_CELSIUS:
        flags.append(f"hot {max(temps):.0f} C")
    flags += _capped_frequency(after)
    load = [_number(v) for path, v in _leaves(before, "load")
            if "1" in path or path.endswith("load")]
    cpus = [_number(v) for path, v in _leaves(before, "cpu_count") + _leaves(before, "ncpu")]
    if load and cpus and load[0] is not None and cpus[0] and load[0] > cpus[0]:
        flags.append(f"loaded (load {load[0]:.1f})")
    return list(dict.fromkeys(flags))


def _capped_frequency(snapshot: dict | None) -> list[str]:
    """A scaling max frequency below the hardware maximum: the kernel capped the clock."""
    scaling = [_number(v) for _, v in _leaves(snapshot, "scaling_max")]
    hardware = [_number(v) for _, v in _leaves(snapshot, "cpuinfo_max")]
    for capped, full in zip(scaling, hardware, strict=False):
        if capped and full and capped < 0.98 * full:
            return ["frequency capped"]
    return []
