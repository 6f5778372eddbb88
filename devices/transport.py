"""The transport interface: how the coordinator reaches a device.

Two implementations: ``LocalTransport`` (this machine, subprocesses) and ``SSHTransport``
(paramiko). A transport is its four primitives: run a command on the host (``run_host``), put a
file there (``upload``), get a file's contents (``fetch``), and ``close``; the only state it keeps
is what cannot change while its connection lasts (``static_facts``, see devices.fingerprint).
What is built on them is shared and lives elsewhere: a run's command line (``device_argv``,
``run``), the content-addressed artifact cache and what a connection knows of it
(``devices.cache.ArtifactCache``), fingerprints (``devices.fingerprint``).

Commands are always argv lists. On SSH every element is quoted with ``shlex.quote`` before it
reaches the remote shell, so no name or parameter can inject shell syntax.
"""

from __future__ import annotations

import posixpath
import shlex
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devices.inventory import Device

# Extra seconds after a command's own timeout before the controller gives up on it: the remote
# `timeout` sends SIGTERM at the deadline and SIGKILL KILL_AFTER_S later.
KILL_AFTER_S = 3.0
GRACE_S = KILL_AFTER_S + 5.0
# The most bytes of a command's stdout (and of its stderr) the controller keeps; the rest is
# read and dropped, so a board that floods its output cannot exhaust the coordinator's memory.
# Above the harness's 16 MiB limit on an engine document, which refuses such a run by name.
MAX_OUTPUT_BYTES = 64 * 1024 * 1024


def keep_capped(kept: bytearray, data: bytes) -> None:
    """Append ``data`` to ``kept`` up to MAX_OUTPUT_BYTES in all."""
    kept += data[:max(0, MAX_OUTPUT_BYTES - len(kept))]


@dataclass
class CommandResult:
    exit_code: int  # -1: killed by a signal without an exit status
    stdout: str
    stderr: str
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def device_argv(device: Device, argv: list[str], cpus: list[int] | None) -> list[str]:
    """The full argv of a run: pinning, then the device's exec prefix, then the command."""
    pinned = cpus if cpus is not None else device.cpus
    taskset = ["taskset", "-c", ",".join(map(str, pinned))] if pinned else []
    return [*taskset, *device.exec_prefix, *map(str, argv)]


def remote_shell_command(workdir: str, argv: list[str], timeout: float) -> str:
    """One shell command line for sshd: every argv element quoted, wrapped in GNU ``timeout``.

    ``timeout`` puts the command in its own process group and signals the whole group at the
    deadline, so nothing the command started outlives it.
    """
    wd = shlex.quote(workdir)
    limited = ["timeout", "-k", f"{KILL_AFTER_S:.0f}", f"{timeout:.1f}", *argv]
    # `mkdir` only when the workdir is missing: one process fewer per command.
    return f"{{ cd {wd} 2>/dev/null || mkdir -p {wd}; }} && cd {wd} && exec {shlex.join(limited)}"


def describe(argv: list[str], limit: int = 120) -> str:
    """A command for an error message: shell-quoted, shortened."""
    text = shlex.join(map(str, argv))
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Transport(ABC):
    """A connection to one device. Use as a context manager or call ``close()``."""

    def __init__(self, device: Device) -> None:
        self.device = device
        # what cannot change while the device is up (arch, kernel, CPU model and parts), from
        # the first fingerprint on this connection (see devices.fingerprint)
        self.static_facts: dict[str, Any] | None = None

    # -- the four primitives each transport implements -------------------------------------

    @abstractmethod
    def run_host(self, argv: list[str], timeout: float,
                 stdin_file: Path | None = None) -> CommandResult:
        """Run a host command in the workdir: no pinning, no exec prefix (for system tools)."""

    @abstractmethod
    def upload(self, local_path: Path, remote_path: str) -> int:
        """Copy a local file to a path on the device; returns the bytes sent."""

    @abstractmethod
    def fetch(self, remote_path: str) -> bytes:
        """The contents of a file on the device (relative paths are under the workdir)."""

    @abstractmethod
    def close(self) -> None: ...

    # -- shared behaviour ---------------------------------------------------------------------

    def run(self, argv: list[str], timeout: float, cpus: list[int] | None = None,
            stdin_file: Path | None = None) -> CommandResult:
        """Run a benchmark command: pinned to ``cpus`` (default: the device's), exec prefix
        prepended. ``stdin_file`` is a local file streamed to the command's stdin."""
        return self.run_host(device_argv(self.device, argv, cpus), timeout, stdin_file)

    def path(self, *parts: str) -> str:
        return posixpath.join(self.device.workdir, *parts)

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
