"""Typed errors of the device layer.

Every error carries an ``exit_code`` class attribute (the command line maps it to the process
exit status: 2 for bad input, 1 for a failure while running) and names what it is about: the
inventory file, device and key, or the device a transport failed on.
"""

from __future__ import annotations


class InventoryError(Exception):
    """An inventory file is malformed or names something that does not exist."""

    exit_code = 2


class DeviceError(Exception):
    """Something failed while talking to a device. ``device`` is its inventory name."""

    exit_code = 1

    def __init__(self, device: str, message: str) -> None:
        super().__init__(f"device {device!r}: {message}")
        self.device = device


class DeviceUnreachable(DeviceError):
    """No connection could be made, or the connection was lost."""


class AuthFailed(DeviceError):
    """The device refused our credentials."""


class HostKeyError(DeviceError):
    """The device's host key could not be verified."""


class UnknownHostKey(HostKeyError):
    """The device's host key is not in the known_hosts file (run `benchfarm devices trust`)."""


class HostKeyMismatch(HostKeyError):
    """The device presented a different host key than the one recorded for it."""


class HostKeyRevoked(HostKeyError):
    """The device presented a host key that its known_hosts file marks ``@revoked``."""


class CommandTimeout(DeviceError):
    """A command ran past its timeout; its process group was killed."""


class BoardLocked(DeviceError):
    """Another coordinator's command holds the board's lock file; nothing ran (try later)."""


class TransferFailed(DeviceError):
    """An artifact could not be pushed, verified or fetched."""


class FarmError(Exception):
    """The local farm could not be started, inspected or stopped."""

    exit_code = 1
