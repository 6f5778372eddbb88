"""SSH credentials travel with a board's runner: the driver reads the key and known_hosts of
each device (``Credentials.of``), and the actor, on whatever node Ray placed it, writes them
into a private folder there (``install``), which it removes when the scheduler retires it
(``DeviceRunner.forget_credentials``). A runner that dies with its node, or whose coordinator
is SIGKILLed, cannot remove its folder: each folder names the process it was made for
(``OWNER``), and the next install on that node removes the folders whose process is gone
(``sweep_abandoned``)."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from devices.errors import AuthFailed
from devices.files import read_text
from devices.inventory import Device
from devices.ssh import load_private_key
from harness.errors import InputError

PREFIX = "benchfarm-credentials-"  # a credentials folder: PREFIX, the device's name, a suffix
OWNER = "owner"  # in each folder: the id of the process it was made for


@dataclass(frozen=True)
class Credentials:
    """A device's private key and known_hosts as the driver read them (None: absent there)."""

    key: str | None
    known_hosts: str | None

    @classmethod
    def of(cls, device: Device) -> Credentials:
        if device.is_local:
            return cls(None, None)  # no SSH: nothing to read (install leaves it as it is)
        try:
            load_private_key(device)  # a public key or garbage: one line here, not in an actor
            key = read_text(device.key) if device.key is not None else None
            hosts = read_text(device.known_hosts) if device.known_hosts.exists() else None
        except AuthFailed as exc:
            raise InputError(str(exc)) from exc
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise InputError(f"device {device.name!r}: cannot read its SSH key or known_hosts "
                             f"on the coordinator: {reason}") from exc
        return cls(key, hosts)

    def install(self, device: Device) -> tuple[Device, Path | None]:
        """The device record with its key and known_hosts in a private folder on this node,
        and that folder (None for a local board, which has no credentials)."""
        if device.is_local:
            return device, None
        sweep_abandoned()
        folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{device.name}-"))  # mode 0700
        (folder / OWNER).write_text(str(os.getpid()))
        known_hosts = folder / "known_hosts"
        known_hosts.write_text(self.known_hosts or "")
        key = None
        if self.key is not None:
            key = folder / "id"
            key.touch(mode=0o600)
            key.write_text(self.key)
        return replace(device, key=key, known_hosts=known_hosts), folder


def sweep_abandoned(root: Path | None = None) -> list[Path]:
    """Remove this user's credentials folders under ``root`` (the temporary folder) whose
    process is gone: those a killed runner left. Returns them."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{PREFIX}*"):
        try:
            if folder.stat().st_uid != os.getuid():
                continue
            pid = int((folder / OWNER).read_text())
        except (OSError, ValueError):
            continue  # another's, or one being made
        if pid > 0 and not _alive(pid):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
