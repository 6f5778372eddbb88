"""The conditions a run ran under that make its timing suspect (emulated, throttled, loaded
...), flagged from device fingerprints: the one implementation.

``devices.fingerprint`` computes each snapshot's flags when it takes the snapshot and stores
them in it (``"flags"``); ``reports`` reads those, and computes them here for snapshots stored
before fingerprints carried flags. This module imports nothing but the standard library so that
``reports`` can use it, and it accepts any JSON (a stored document may be old or hand-made).

A snapshot is taken ``before`` or ``after`` a run. Everything is judged on both, except the load
and free memory, which only mean something before: the run itself loads the machine.
"""

from __future__ import annotations

from typing import Any

# Stable names, in the order a report lists them.
EMULATED = "emulated"
GOVERNOR = "non-performance-governor"
THROTTLING = "throttling"
MEMORY_CLOCK = "memory-clock-low"
LOADED = "loaded"
LOW_MEMORY = "low-memory"
ORDER = (EMULATED, GOVERNOR, THROTTLING, MEMORY_CLOCK, LOADED, LOW_MEMORY)

# Thresholds: chosen to be quiet on a healthy idle board.
HOT_C = 85.0  # RK3588 starts thermal throttling around 85 degC
CAPPED_RATIO = 0.98  # below 98 % of a maximum counts as below it (clock granularity)
LOADED_PER_CPU = 0.3  # 1-minute load average per online CPU before the run
LOADED_MIN = 1.0
LOW_MEMORY_RATIO = 0.1  # available / total memory
# devfreq devices that clock the DRAM: "dmc" on Rockchip (RK3588), "ddr"/"memory" elsewhere.
MEMORY_DEVFREQ = ("dmc", "ddr", "memory")


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _online(fingerprint: dict[str, Any]) -> list[dict[str, Any]]:
    return [core for core in _dicts(fingerprint.get("cores")) if core.get("online")]


def _throttled(fingerprint: dict[str, Any]) -> bool:
    for core in _online(fingerprint):
        hw_max, cap = _number(core.get("max_khz")), _number(core.get("policy_max_khz"))
        cur = _number(core.get("cur_khz"))
        if hw_max and cap and cap < CAPPED_RATIO * hw_max:
            return True  # a thermal or user cap on the policy
        # Under the performance governor an unthrottled core runs at its policy maximum.
        if core.get("governor") == "performance" and cap and cur and cur < CAPPED_RATIO * cap:
            return True
    return any((_number(zone.get("temp_c")) or 0.0) >= HOT_C
               for zone in _dicts(fingerprint.get("thermal")))


def memory_controllers(fingerprint: dict[str, Any]) -> list[dict[str, Any]]:
    """The devfreq devices of a fingerprint that clock the memory."""
    return [dev for dev in _dicts(fingerprint.get("devfreq"))
            if any(word in str(dev.get("device", "")).lower() for word in MEMORY_DEVFREQ)]


def _memory_clock_low(fingerprint: dict[str, Any]) -> bool:
    """A memory controller running below the highest frequency it offers (or, when it lists
    none, below its maximum): a bootloader without DMC DVFS, a cap, or an idle ondemand
    governor all make tok/s figures incomparable."""
    for dev in memory_controllers(fingerprint):
        offered = [f for f in map(_number, dev.get("available_hz") or []) if f]
        top = max(offered) if offered else _number(dev.get("max_hz"))
        cur = _number(dev.get("cur_hz"))
        if top and cur is not None and cur < CAPPED_RATIO * top:
            return True
    return False


def snapshot_flags(fingerprint: Any, phase: str) -> list[str]:
    """The flags one snapshot raises; ``phase`` is "before" or "after" the run."""
    if not isinstance(fingerprint, dict):
        return []
    found = set()
    if fingerprint.get("emulated"):
        found.add(EMULATED)
    governors = {core.get("governor") for core in _online(fingerprint)} - {None}
    if governors - {"performance"}:
        found.add(GOVERNOR)
    if _throttled(fingerprint):
        found.add(THROTTLING)
    if _memory_clock_low(fingerprint):
        found.add(MEMORY_CLOCK)
    if phase == "before":
        cpus = max(len(_online(fingerprint)), 1)
        load = fingerprint.get("loadavg")
        one_minute = _number(load[0]) if isinstance(load, list) and load else None
        if one_minute is not None and one_minute > max(LOADED_MIN, LOADED_PER_CPU * cpus):
            found.add(LOADED)
        total = _number(fingerprint.get("mem_total_kb"))
        available = _number(fingerprint.get("mem_available_kb"))
        if total and available is not None and available < LOW_MEMORY_RATIO * total:
            found.add(LOW_MEMORY)
    return [flag for flag in ORDER if flag in found]


def stored_or_computed(fingerprint: Any, phase: str) -> list[str]:
    """The flags a stored snapshot carries, or, for one stored without them, computed now."""
    if isinstance(fingerprint, dict) and isinstance(fingerprint.get("flags"), list):
        return [str(flag) for flag in fingerprint["flags"]]
    return snapshot_flags(fingerprint, phase)


def run_flags(before: Any, after: Any) -> list[str]:
    """The flags of a run: those of its snapshots, each once, known names first in ORDER."""
    found = stored_or_computed(before, "before") + stored_or_computed(after, "after")
    known = [flag for flag in ORDER if flag in found]
    return known + [flag for flag in dict.fromkeys(found) if flag not in ORDER]
