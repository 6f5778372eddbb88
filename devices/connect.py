"""Opening a transport to a device: ``connect(device)``.

Apart from ``devices.transport`` (the interface) so that the interface never imports its
implementations, which import it.
"""

from __future__ import annotations

from devices.inventory import Device
from devices.local import LocalTransport
from devices.transport import Transport


def connect(device: Device) -> Transport:
    """A transport to ``device``: local for the boards on this machine (``local`` and those
    with ``transport = "local"``), SSH for everything else."""
    if device.is_local:
        return LocalTransport(device)
    # paramiko takes about 0.3 s to import: only when a device needs it
    from devices.ssh import SSHTransport

    return SSHTransport(device)
