"""Health checks of boards, stored: `benchfarm devices check`, and the ones `serve` schedules
(before a board's first job, then again once ``interval_s`` has passed).

A check (devices.health: reachable, arch, workdir, free disk, the engine's own health command)
is stored with its items (db.boards); a failed check makes an online board ``bad``, which is
announced through the notification targets.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from db.audit import AuditEvent
from db.boards import ONLINE
from db.limits import FMA_GFLOPS, READ_CURVE, READ_GBPS
from db.store import Store
from devices.health import CheckReport, LimitProbe, check_device
from devices.inventory import Device
from harness import REPO_ROOT
from harness.engines import DEFAULT_ENGINE, adapter_of, build_program, health_command
from harness.errors import InputError, RunFailure
from harness.execution.gate import went_bad
from harness.execution.notify import Targets

DEFAULT_INTERVAL_S = 3600.0
BENCH_C = REPO_ROOT / "bench" / "c"
# read buffers: from inside a board's caches to well beyond its last-level cache (the last,
# the memory's bandwidth); a few seconds in all under an emulator
READ_MIB = (1, 4, 16, 128)


class EngineBinaries:
    """The farm's engine (``DEFAULT_ENGINE``) for each architecture: given (``--binary``), else
    built once (cached)."""

    def __init__(self, given: dict[str, Path] | None = None) -> None:
        self.found: dict[str, tuple[Path | None, str | None]] = {
            arch: (path, None) for arch, path in (given or {}).items()}
        self.limit_probes: dict[str, list[LimitProbe]] = {}

    def for_arch(self, arch: str) -> tuple[Path | None, str | None]:
        if arch not in self.found:
            try:
                self.found[arch] = (Path(adapter_of(DEFAULT_ENGINE).build(arch, None).binary), None)
            except Exception as exc:  # noqa: BLE001 - any build failure becomes a failed check
                if getattr(type(exc), "exit_code", None) is None:
                    raise
                self.found[arch] = (None, f"building {DEFAULT_ENGINE} for {arch} failed: {exc}")
        return self.found[arch]

    def probes(self, arch: str) -> list[LimitProbe]:
        """The board's limit probes (``bench/c``'s programs built for ``arch``, once)."""
        if arch not in self.limit_probes:
            self.limit_probes[arch] = [
                LimitProbe(name, key, *_program(program, arch), argv, parse)
                for name, key, program, argv, parse in LIMIT_PROGRAMS]
        return self.limit_probes[arch]


def _program(name: str, arch: str) -> tuple[Path | None, str | None]:
    try:
        return build_program(name, [BENCH_C / f"{name}.c"], arch), None
    except (InputError, RunFailure) as exc:
        return None, f"building {name} for {arch} failed: {str(exc).splitlines()[0]}"


def _read_bandwidth(outputs: list[str]) -> tuple[float, dict[str, Any], str]:
    """The bandwidth over the largest buffer (from memory), and by buffer size (what a
    working set of that size can be read at, at most: caches are faster)."""
    found = [json.loads(out) for out in outputs]
    curve = {str(f["bytes"] >> 20): float(f["gbps_best"]) for f in found}
    largest = found[-1]
    gbps = float(largest["gbps_best"])
    sizes = ", ".join(f"{mib} MiB {value:.1f}" for mib, value in curve.items())
    return gbps, {READ_CURVE: curve}, (f"{gbps:.2f} GB/s read from memory ({largest['threads']} "
                                       f"threads; GB/s by buffer: {sizes})")


def _fma_peak(outputs: list[str]) -> tuple[float, dict[str, Any], str]:
    found = json.loads(outputs[0])
    gflops = float(found["best_gflops"])
    return gflops, {}, f"{gflops:.2f} GFLOP/s per core ({found['simd']})"


def _read_runs(binary: str, device: Device) -> list[list[str]]:
    return [[binary, "--mib", str(mib), "--passes", "3", "--threads", str(device.threads or 1)]
            for mib in READ_MIB]


# the limits a health check measures: (item name, stored key, program, its runs, its parser)
LIMIT_PROGRAMS = [
    ("memory read", READ_GBPS, "stream_read", _read_runs, _read_bandwidth),
    ("fma peak", FMA_GFLOPS, "fma_peak", lambda binary, _device: [[binary, "--passes", "2"]],
     _fma_peak),
]


def check_and_store(device: Device, binaries: EngineBinaries, store: Store, by: str,
                    targets: Targets, event: AuditEvent | None = None) -> CheckReport:
    """Check one board (its limits too: ``limit_probes``), store the result (and ``event``,
    the caller's action, with it), and set it bad (announced) when it failed."""
    binary, problem = binaries.for_arch(device.arch)
    report = check_device(device, health_command(DEFAULT_ENGINE, binary, problem),
                          probes=binaries.probes(device.arch))
    items = [{"name": i.name, "ok": i.ok, "detail": i.detail}
             | ({"key": i.key, "value": i.value} if i.key else {}) | i.extra
             for i in report.items]
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
