"""The transport interface: how the coordinator reaches a device.

Two implementations: ``LocalTransport`` (this machine, subprocesses) and ``SSHTransport``
(paramiko). Both share the artifact cache protocol (``devices.cache``) and the way a run's
command line is built (``device_argv``), so they differ only in four primitives: run a command
on the host, upload a file, read a file, close.

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


@dataclass
class CommandResult:
    exit_code: int  # -1: killed by a signal without an exit status
    stdout: str
    stderr: str
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass
class PushResult:
    """What one push did: ``status`` is "cached", "sent" or "repaired" (a corrupt copy replaced)."""

    local: str
    remote: str
    sha256: str
    size: int
    bytes_sent: int
    status: str


@dataclass(frozen=True)
class PushedArtifact:
    """What a push put on the device, so a later run can check it is still intact."""

    local: Path  # the file or directory that was pushed
    is_tree: bool
    blobs: tuple[str, ...]  # sha256 of each cached file it consists of
    links: tuple[tuple[str, str], ...] = ()  # a tree's entries: (path on the device, sha256)


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
        self.bytes_sent = 0  # over the lifetime of this transport
        self.last_push: PushResult | None = None
        # sha256 -> stat signature of cached blobs this transport verified (see devices.cache)
        self.verified_blobs: dict[str, str] = {}
        self.pushed: dict[str, PushedArtifact] = {}  # by the path a push returned
        # what cannot change while the device is up (arch, kernel, CPU model and parts), from
        # the first fingerprint on this connection (see devices.fingerprint)
        self.static_facts: dict[str, Any] | None = None

    # -- primitives each transport implements -------------------------------------------------

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

    def push(self, local_path: Path | str) -> str:
        """Put a file in the device's content-addressed cache; returns its path there."""
        from devices.cache import push_file

        return push_file(self, Path(local_path))

    def push_tree(self, local_dir: Path | str) -> str:
        """Put a directory (e.g. a model) on the device, content-addressed; returns its path."""
        from devices.cache import push_tree

        return push_tree(self, Path(local_dir))

    def path(self, *parts: str) -> str:
        return posixpath.join(self.device.workdir, *parts)

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def connect(device: Device) -> Transport:
    """A transport to ``device``: local for ``local``, SSH for everything else."""
    if device.is_local:
        from devices.local import LocalTransport

        return LocalTransport(device)
    from devices.ssh import SSHTransport

    return SSHTransport(device)
