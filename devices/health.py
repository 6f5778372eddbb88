"""`devices check`: is a device ready to run benchmarks?

Reachable, the architecture it claims, a writable workdir with free space, and (given a binary
built for it) the engine's own health command runs there (``lmc info``: and reports the same
architecture). What that command is and how its output is judged comes from the engine's
adapter (``harness.engines``), as a :class:`HealthCommand`: this package knows no engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devices.cache import ArtifactCache
from devices.connect import connect
from devices.errors import DeviceError
from devices.inventory import Device
from devices.transport import Transport

MIN_FREE_MB = 200  # a small model, a few binaries and their trees
CHECK_TIMEOUT_S = 60.0
PROBE_TIMEOUT_S = 300.0  # a limit probe on an emulated board runs some ten times slower
WRITE_TEST = 'f=".benchfarm-write-test.$$" && : > "$f" && rm -f -- "$f"'


@dataclass(frozen=True)
class HealthCommand:
    """How to prove an engine runs on a device: its health command and the verdict on it."""

    name: str  # the check's name in the report, e.g. "lmc info"
    binary: Path | None  # the engine built for the device's architecture
    problem: str | None  # why there is no binary
    argv: Callable[[str], list[str]]  # the command, given the binary's path on the device
    # (stdout, stderr, device arch) -> (ok, detail), for a command that exited 0
    verdict: Callable[[str, str, str], tuple[bool, str]]


@dataclass(frozen=True)
class LimitProbe:
    """A small program measuring what the board can physically do (its memory read bandwidth,
    its FMA peak): built for the board's architecture, pushed and run there like the engine.
    ``parse`` turns its stdout into the figure (``key``, in ``unit``) and a detail."""

    name: str  # the check's name, e.g. "memory read"
    key: str  # the figure's name where it is stored, e.g. "read_gbps"
    binary: Path | None
    problem: str | None  # why there is no binary
    # the runs, given the binary's path on the board
    argvs: Callable[[str, Device], list[list[str]]]
    # each run's stdout -> (the figure, what else to keep, a detail); ValueError if unreadable
    parse: Callable[[list[str]], tuple[float, dict[str, Any], str]]


@dataclass
class CheckItem:
    name: str
    ok: bool
    detail: str
    key: str | None = None  # a figure's name (a limit probe's), with its value
    value: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # more of a probe's figures


@dataclass
class CheckReport:
    device: str
    items: list[CheckItem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(item.ok for item in self.items)

    def add(self, name: str, ok: bool, detail: str, key: str | None = None,
            value: float | None = None, extra: dict[str, Any] | None = None) -> None:
        self.items.append(CheckItem(name, ok, detail, key, value, extra or {}))


def check_device(device: Device, health: HealthCommand, min_free_mb: int = MIN_FREE_MB,
                 probes: Sequence[LimitProbe] = ()) -> CheckReport:
    """Run every check (then each limit probe); a failed step is recorded, not raised."""
    report = CheckReport(device.name)
    try:
        transport = connect(device)
    except DeviceError as exc:
        report.add("reachable", False, str(exc))
        return report
    with transport:
        report.add("reachable", True, device.address)
        try:
            _check_host(transport, report, min_free_mb)
            _check_engine(transport, report, health)
            for probe in probes:
                _measure_limit(transport, report, probe)
        except DeviceError as exc:
            report.add("connection", False, str(exc))
    return report


def _check_host(transport: Transport, report: CheckReport, min_free_mb: int) -> None:
    device = transport.device
    host_arch = transport.run_host(["uname", "-m"], CHECK_TIMEOUT_S).stdout.strip()
    if device.emulated and device.exec_prefix:
        emulator = device.exec_prefix[0]
        found = transport.run_host(["sh", "-c", 'command -v -- "$1"', "sh", emulator],
                                   CHECK_TIMEOUT_S)
        report.add("arch", found.ok, f"host {host_arch}; {device.arch} emulated by {emulator}"
                   + ("" if found.ok else " which is not installed on the device"))
    else:
        report.add("arch", host_arch == device.arch,
                   f"device reports {host_arch}, inventory says {device.arch}")

    writable = transport.run_host(["sh", "-c", WRITE_TEST], CHECK_TIMEOUT_S)
    report.add("workdir", writable.ok, f"{device.workdir} "
               + ("writable" if writable.ok else f"not writable: {writable.stderr.strip()}"))

    df = transport.run_host(["df", "-Pk", "."], CHECK_TIMEOUT_S)
    try:
        free_mb = int(df.stdout.splitlines()[-1].split()[3]) // 1024
    except (IndexError, ValueError):
        report.add("free disk", False, f"cannot read `df -Pk` output: {df.stderr.strip()}")
        return
    report.add("free disk", free_mb >= min_free_mb,
               f"{free_mb} MiB free in {device.workdir} (need {min_free_mb})")


def _check_engine(transport: Transport, report: CheckReport, health: HealthCommand) -> None:
    if health.binary is None:
        report.add(health.name, False, health.problem or "no engine binary for this device")
        return
    cache = ArtifactCache(transport)
    remote = cache.push(health.binary)
    pushed = cache.last_push
    result = transport.run(health.argv(remote), timeout=CHECK_TIMEOUT_S)
    if not result.ok:
        report.add(health.name, False, f"exit code {result.exit_code}: {result.stderr.strip()}")
        return
    ok, detail = health.verdict(result.stdout, result.stderr, transport.device.arch)
    report.add(health.name, ok, f"{detail}, push {pushed.status if pushed else '?'}, "
               f"{result.wall_s * 1000:.0f} ms")


def _measure_limit(transport: Transport, report: CheckReport, probe: LimitProbe) -> None:
    """A figure the board's limits are judged by, or an item saying why it was not measured
    (not a fault of the board's: it does not fail the check)."""
    if probe.binary is None:
        report.add(probe.name, True, f"not measured: {probe.problem or 'no program'}")
        return
    remote = ArtifactCache(transport).push(probe.binary)
    outputs = []
    for argv in probe.argvs(remote, transport.device):
        result = transport.run(argv, timeout=PROBE_TIMEOUT_S)
        if not result.ok:
            report.add(probe.name, True, f"not measured: exit code {result.exit_code}: "
                       f"{result.stderr.strip()}")
            return
        outputs.append(result.stdout)
    try:
        value, extra, detail = probe.parse(outputs)
    except (ValueError, KeyError, TypeError) as exc:
        report.add(probe.name, True, f"not measured: unreadable output ({exc!r})")
        return
    report.add(probe.name, True, detail, probe.key, value, extra)
