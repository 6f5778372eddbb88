"""The CPU each run ran on, from its snapshots (``devices.fingerprint``: ``cpu_model``, the
``/proc/cpuinfo`` model name, and ``cpu_id``, lscpu's vendor/family/model/stepping or ARM's
implementer/variant/part), so that timings from different CPU models are never merged or
compared as like with like without a flag saying so. A device name can outlive its hardware (a
VM moved to another host type, a board swapped): the name alone does not pin the CPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MIXED = "mixed CPU models"


def cpu_label(fingerprint: dict[str, Any] | None) -> str:
    """``model name (cpu_id)``, what is known of the two, or "" (no snapshot, old schema)."""
    if not fingerprint:
        return ""
    model = str(fingerprint.get("cpu_model") or fingerprint.get("cpu") or "")
    ident = str(fingerprint.get("cpu_id") or "")
    return f"{model} ({ident})" if model and ident else model or ident


def run_cpu(phases: dict[str, Any]) -> str:
    """A run's CPU: its snapshot before the run, else the one after."""
    return cpu_label(phases.get("before")) or cpu_label(phases.get("after"))


def mixed_cpu_flag(labels: Iterable[Any]) -> str:
    """A flag when the labels name more than one CPU ("" when they agree; unknown CPUs, runs
    stored without a CPU in their snapshots, are left out)."""
    distinct = sorted({str(label) for label in labels if isinstance(label, str) and label})
    return f"{MIXED}: {' | '.join(distinct)}" if len(distinct) > 1 else ""
