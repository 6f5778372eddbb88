"""Health checks of boards, stored: `benchfarm devices check`, and the ones `serve` schedules
(before a board's first job, then again once ``interval_s`` has passed).

A check (devices.health: reachable, arch, workdir, free disk, the engine's own health command)
is stored with its items (db.boards); a failed check makes an online board ``bad``, which is
announced through the notification targets.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

from db.audit import AuditEvent
from db.boards import ONLINE
from db.store import Store
from devices.health import CheckReport, check_device
from devices.inventory import Device
from harness.engines import DEFAULT_ENGINE, adapter_of, health_command
from harness.execution.gate import went_bad
from harness.execution.notify import Targets

DEFAULT_INTERVAL_S = 3600.0


class EngineBinaries:
    """The farm's engine (``DEFAULT_ENGINE``) for each architecture: given (``--binary``), else
    built once (cached)."""

    def __init__(self, given: dict[str, Path] | None = None) -> None:
        self.found: dict[str, tuple[Path | None, str | None]] = {
            arch: (path, None) for arch, path in (given or {}).items()}

    def for_arch(self, arch: str) -> tuple[Path | None, str | None]:
        if arch not in self.found:
            try:
                self.found[arch] = (Path(adapter_of(DEFAULT_ENGINE).build(arch, None).binary), None)
            except Exception as exc:  # noqa: BLE001 - any build failure becomes a failed check
                if getattr(type(exc), "exit_code", None) is None:
                    raise
                self.found[arch] = (None, f"building {DEFAULT_ENGINE} for {arch} failed: {exc}")
        return self.found[arch]


def check_and_store(device: Device, binaries: EngineBinaries, store: Store, by: str,
                    targets: Targets, event: AuditEvent | None = None) -> CheckReport:
    """Check one board, store the result (and ``event``, the caller's action, with it), and
    set it bad (announced) when it failed."""
    binary, problem = binaries.for_arch(device.arch)
    report = check_device(device, health_command(DEFAULT_ENGINE, binary, problem))
    items = [{"name": i.name, "ok": i.ok, "detail": i.detail} for i in report.items]
    if store.boards.record_health(device.name, report.ok, items, by, event):
        went_bad(store, device.name, targets)
    return report


class HealthSchedule:
    """The checks one `serve` runs: a board's first before its first job, then every
    ``interval_s`` (before a job that uses it, or while the service idles). Only online
    boards are checked: one in maintenance is being worked on, a bad one waits for a
    person."""

    def __init__(self, store: Store, by: str, targets: Targets, interval_s: float) -> None:
        self.store = store
        self.by = by
        self.targets = targets
        self.interval_s = interval_s
        self.binaries = EngineBinaries()
        self.checked: dict[str, float] = {}  # board -> when this serve last checked it
        self.known: dict[str, Device] = {}  # the boards this serve has checked

    def before_job(self, devices: Iterable[Device]) -> list[CheckReport]:
        """Check the boards that are due; their reports."""
        devices = list(devices)
        states = self.store.boards.states([d.name for d in devices])
        reports = []
        for device in devices:
            last = self.checked.get(device.name)
            if states[device.name].state != ONLINE or \
                    (last is not None and time.monotonic() - last < self.interval_s):
                continue
            reports.append(check_and_store(device, self.binaries, self.store, self.by,
                                           self.targets))
            self.checked[device.name] = time.monotonic()
            self.known[device.name] = device
        return reports

    def while_idle(self) -> list[CheckReport]:
        """Check again the boards checked before whose interval has passed."""
        return self.before_job(self.known.values())
