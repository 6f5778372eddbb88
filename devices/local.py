"""LocalTransport: a board on this machine (``local``, or ``transport = "local"``); commands are
plain subprocesses in its workdir."""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import time
from pathlib import Path

from devices.errors import CommandTimeout, TransferFailed
from devices.inventory import Device
from devices.transport import CommandResult, Transport, describe, keep_capped


class LocalTransport(Transport):
    def __init__(self, device: Device) -> None:
        super().__init__(device)
        try:
            Path(device.workdir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TransferFailed(device.name, f"cannot create workdir {device.workdir}: "
                                              f"{exc.strerror}") from exc

    def run_host(self, argv: list[str], timeout: float,
                 stdin_file: Path | None = None) -> CommandResult:
        start = time.monotonic()
        stdin = open(stdin_file, "rb") if stdin_file else subprocess.DEVNULL  # noqa: SIM115
        try:
            # A new session makes the command a process-group leader, so a timeout can kill
            # everything it started.
            proc = subprocess.Popen(argv, cwd=self.device.workdir, stdin=stdin,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except FileNotFoundError:
            return CommandResult(127, "", f"{argv[0]}: command not found\n",
                                 time.monotonic() - start)
        except PermissionError:
            return CommandResult(126, "", f"{argv[0]}: permission denied\n",
                                 time.monotonic() - start)
        finally:
            if stdin_file:
                stdin.close()
        try:
            out, err = _read_capped(proc, time.monotonic() + timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.communicate()
            message = (f"`{describe(argv)}` ran past its {timeout:g} s timeout; its process "
                       "group was killed")
            raise CommandTimeout(self.device.name, message) from None
        return CommandResult(proc.returncode if proc.returncode >= 0 else -1,
                             out.decode(errors="replace"), err.decode(errors="replace"),
                             time.monotonic() - start)

    def upload(self, local_path: Path, remote_path: str) -> int:
        try:
            shutil.copyfile(local_path, remote_path)
        except OSError as exc:
            raise TransferFailed(self.device.name, f"cannot copy {local_path} to {remote_path}: "
                                                   f"{exc.strerror}") from exc
        return local_path.stat().st_size

    def fetch(self, remote_path: str) -> bytes:
        try:
            return Path(self.path(remote_path)).read_bytes()
        except OSError as exc:
            raise TransferFailed(self.device.name, f"cannot read {remote_path}: "
                                                   f"{exc.strerror}") from exc

    def close(self) -> None:
        pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _read_capped(proc: subprocess.Popen, deadline: float) -> tuple[bytes, bytes]:
    """``proc.communicate`` with a deadline, keeping at most MAX_OUTPUT_BYTES of each stream;
    subprocess.TimeoutExpired when the deadline passes first."""
    kept = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    with selectors.DefaultSelector() as streams:
        for stream in kept:
            streams.register(stream, selectors.EVENT_READ)
        while streams.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(proc.args, 0)
            for key, _ in streams.select(left):
                data = os.read(key.fd, 1 << 16)
                if data:
                    keep_capped(kept[key.fileobj], data)
                else:
                    streams.unregister(key.fileobj)
    proc.wait(max(0.0, deadline - time.monotonic()))
    return bytes(kept[proc.stdout]), bytes(kept[proc.stderr])

