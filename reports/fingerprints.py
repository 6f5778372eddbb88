"""Flags from the device fingerprints stored before and after a run.

The fingerprint documents are written by ``devices.fingerprint`` (schema
``benchfarm.fingerprint/1``: ``cores`` with governor and frequencies, ``thermal`` zones,
``loadavg``, ``emulated``). When the coordinator stored the flags it computed (a ``flags`` list in
a snapshot), those are used as they are; otherwise the few that matter for a timing's trust are
read from the documented fields here, since ``reports`` does not import ``devices``.
"""

from __future__ import annotations

from typing import Any

HOT_C = 85.0  # RK3588 starts thermal throttling around 85 degC
CAPPED_RATIO = 0.98  # a policy maximum below the hardware maximum: the kernel capped the clock


def _online(fingerprint: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in fingerprint.get("cores") or [] if isinstance(c, dict) and c.get("online")]


def _throttled(fingerprint: dict[str, Any]) -> bool:
    for core in _online(fingerprint):
        hw_max, cap = core.get("max_khz"), core.get("policy_max_khz")
        if hw_max and cap and cap < CAPPED_RATIO * hw_max:
            return True
    return any((zone.get("temp_c") or 0) >= HOT_C for zone in fingerprint.get("thermal") or []
               if isinstance(zone, dict))


def fingerprint_flags(before: dict | None, after: dict | None) -> list[str]:
    """Reasons to distrust the timings of a run, as short stable names."""
    snapshots = [s for s in (before, after) if isinstance(s, dict)]
    stored = [flag for s in snapshots for flag in s.get("flags") or []]
    if stored:
        return list(dict.fromkeys(str(flag) for flag in stored))
    flags = []
    if any(s.get("emulated") for s in snapshots):
        flags.append("emulated")
    governors = {c.get("governor") for s in snapshots for c in _online(s)} - {None}
    if governors - {"performance"}:
        flags.append("non-performance-governor")
    if any(_throttled(s) for s in snapshots):
        flags.append("throttling")
    return flags
