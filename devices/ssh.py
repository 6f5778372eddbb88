"""SSHTransport: a device reached over SSH with paramiko.

- Host keys are checked against the device's known_hosts file, read by ``devices.known_hosts``
  (as tolerantly as OpenSSH; paramiko is given no host keys and asks ``verify_host_key``).
  Unknown keys are refused (``UnknownHostKey``), unless the inventory sets
  ``insecure_accept_new = true``; then the key is accepted and appended. A changed key is
  always refused (``HostKeyMismatch``), and so is a key marked ``@revoked`` (``HostKeyRevoked``).
- Connecting retries transient failures (refused, reset, timed out) with exponential backoff;
  authentication and host-key failures are not retried.
- A command gets a remote deadline (GNU ``timeout`` kills its process group) and a local one a
  little later; losing the connection during a command raises ``DeviceUnreachable`` at once.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import posixpath
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import paramiko

from devices import known_hosts
from devices.errors import (
    AuthFailed,
    CommandTimeout,
    DeviceError,
    DeviceUnreachable,
    HostKeyError,
    HostKeyMismatch,
    HostKeyRevoked,
    TransferFailed,
    UnknownHostKey,
)
from devices.files import read_bytes
from devices.inventory import Device
from devices.transport import (
    GRACE_S,
    CommandResult,
    Transport,
    describe,
    keep_capped,
    remote_shell_command,
)

POLL_S = 0.05  # how often a waiting command re-checks its deadline and the connection
SFTP_STALL_S = 60.0  # an SFTP transfer that receives nothing for this long has failed
FIRST_BACKOFF_S = 0.5
# Exit codes of GNU timeout: 124 = deadline reached (SIGTERM), 137 = had to SIGKILL.
TIMEOUT_EXIT_CODES = (124, 137)
# paramiko logs every dropped connection; our typed errors already say what happened.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only
# paramiko raises these for network trouble; the connection may work on a later attempt.
TRANSIENT = (OSError, EOFError, paramiko.SSHException)
T = TypeVar("T")


def blob_fingerprint(blob: bytes) -> str:
    """OpenSSH's fingerprint format of a public-key blob: SHA256:<base64 without padding>."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def key_fingerprint(key: paramiko.PKey) -> str:
    return blob_fingerprint(key.asbytes())


def known_hosts_name(device: Device) -> str:
    """The name a host's entry has in known_hosts (OpenSSH and paramiko agree on it)."""
    return device.host if device.port == 22 else f"[{device.host}]:{device.port}"


def _recorded(verdict: known_hosts.Verdict) -> str:
    return ", ".join(f"{e.key_type} {blob_fingerprint(e.blob)} (line {e.line})"
                     for e in verdict.recorded)


def _read_known_hosts(device: Device, read: Callable[[Path, str], T]) -> T:
    try:
        return read(device.known_hosts, known_hosts_name(device))
    except OSError as exc:
        raise HostKeyError(device.name, f"cannot read {device.known_hosts}: "
                                        f"{exc.strerror or exc}") from exc


# Host-key algorithms whose keys known_hosts records under another type name.
KEY_TYPE_OF_ALGORITHM = {"rsa-sha2-512": "ssh-rsa", "rsa-sha2-256": "ssh-rsa"}


def _transport_factory(device: Device) -> Callable[..., paramiko.Transport]:
    """paramiko Transports that ask for the host-key types recorded for the device first (as
    OpenSSH orders its HostKeyAlgorithms), so a board known by an older type of key, e.g.
    ECDSA, presents that one rather than a newer key nobody recorded."""
    recorded = _read_known_hosts(device, known_hosts.recorded_types)

    def make(sock: socket.socket, **kwargs: Any) -> paramiko.Transport:
        transport = paramiko.Transport(sock, **kwargs)
        options = transport.get_security_options()
        first = [a for a in options.key_types if KEY_TYPE_OF_ALGORITHM.get(a, a) in recorded]
        options.key_types = first + [a for a in options.key_types if a not in first]
        return transport
    return make


def _check(device: Device, key: paramiko.PKey) -> known_hosts.Verdict:
    """What the device's known_hosts says of ``key``; a revoked key is refused here."""
    verdict = _read_known_hosts(device, lambda path, name: known_hosts.check(
        path, name, key.get_name(), key.asbytes()))
    if verdict.status == "revoked":
        raise HostKeyRevoked(device.name, f"{device.address} presented {key.get_name()} "
                                          f"{key_fingerprint(key)}, which line "
                                          f"{verdict.entry.line} of {device.known_hosts} marks "
                                          "@revoked; refusing it (remove that line only if the "
                                          "key is trustworthy again)")
    return verdict


def _append(device: Device, lines: list[str]) -> None:
    try:
        known_hosts.append(device.known_hosts, lines)
    except OSError as exc:
        raise HostKeyError(device.name, f"cannot append to {device.known_hosts}: "
                                        f"{exc.strerror or exc}") from exc


def verify_host_key(device: Device, key: paramiko.PKey) -> None:
    """Accept ``key`` for ``device`` only as its known_hosts file allows (see devices.known_hosts);
    with ``insecure_accept_new`` an unknown key is recorded and accepted."""
    path, name = device.known_hosts, known_hosts_name(device)
    presented = f"{key.get_name()} {key_fingerprint(key)}"
    verdict = _check(device, key)
    if verdict.status == "known":
        return
    if verdict.status == "changed":
        raise HostKeyMismatch(
            device.name,
            f"{device.address} presented {presented} but {path} records {_recorded(verdict)}; "
            "refusing to connect (if the board was reinstalled, check the new key and run "
            f"`benchfarm devices trust --replace {device.name}`)")
    if not device.insecure_accept_new:
        raise UnknownHostKey(device.name, f"host key of {name} ({presented}) is not in {path}; "
                                          "check it, then run "
                                          f"`benchfarm devices trust {device.name}`")
    _append(device, [known_hosts.entry_line(name, key.get_name(), key.asbytes())])


class _CheckKnownHosts(paramiko.MissingHostKeyPolicy):
    """paramiko is given no host keys, so it asks this policy about every key it is shown."""

    def __init__(self, device: Device) -> None:
        self.device = device

    def missing_host_key(self, client, hostname, key) -> None:  # noqa: ANN001 - paramiko API
        verify_host_key(self.device, key)


def fetch_host_key(device: Device) -> paramiko.PKey:
    """The host key the device presents, before any authentication (of a type recorded for it,
    when it has one, as for a connection)."""
    make_transport = _transport_factory(device)
    try:
        sock = socket.create_connection((device.host, device.port), timeout=device.connect_timeout)
    except OSError as exc:
        raise DeviceUnreachable(device.name, f"cannot connect to {device.address}: {exc}") from exc
    transport = make_transport(sock)
    try:
        transport.start_client(timeout=device.connect_timeout)
        return transport.get_remote_server_key()
    except TRANSIENT as exc:
        raise DeviceUnreachable(device.name, f"SSH handshake with {device.address} failed: "
                                             f"{exc}") from exc
    finally:
        transport.close()


class _QuickAckSocket(socket.socket):
    """A TCP socket that acknowledges what it receives at once (Linux's TCP_QUICKACK).

    sshd writes with Nagle's algorithm on, so a reply it writes while an earlier segment is
    unacknowledged waits for that ACK, which this side's kernel delays by up to 40 ms when it has
    nothing to send. Right after authentication sshd sends a message that needs no answer (its
    host keys), so without this the first channel of every connection waited that long. The
    kernel clears the flag again on its own, hence it is set after every read.
    """

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        self.setsockopt(socket.IPPROTO_TCP, TCP_QUICKACK, 1)
        return data


def _open_socket(device: Device) -> socket.socket:
    """A TCP connection to the device tuned for request/response traffic.

    Every SSH request (open a channel, exec, an SFTP call) is a small packet that waits for the
    answer to the previous one. With Nagle's algorithm on, each would first wait out the peer's
    delayed ACK (~40 ms on Linux): that was most of the cost of a remote command on a fast link.
    """
    sock = socket.create_connection((device.host, device.port), timeout=device.connect_timeout)
    if TCP_QUICKACK is not None:
        sock = _QuickAckSocket(fileno=sock.detach())
        sock.settimeout(device.connect_timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


# the most of a key file read: private keys are a few KiB (RSA 16384 bits: under 13 KiB)
MAX_KEY_BYTES = 1 << 20


def load_private_key(device: Device) -> paramiko.PKey | None:
    """The device's private key (None when the inventory names none). A file that is not a
    regular file, a public key or anything else paramiko cannot read is AuthFailed, one line."""
    if device.key is None:
        return None
    try:
        read_bytes(device.key, MAX_KEY_BYTES)  # the type and size first: a FIFO would hang
        return paramiko.PKey.from_path(device.key)
    except OSError as exc:
        raise AuthFailed(device.name, f"cannot read private key {device.key}: "
                                      f"{exc.strerror or exc}") from exc
    except (paramiko.SSHException, ValueError) as exc:
        raise AuthFailed(device.name, f"key {device.key} is not an SSH private key that can be "
                                      "read (a public key, or encrypted? the inventory's key "
                                      "must be the unencrypted private key)") from exc


class SSHTransport(Transport):
    def __init__(self, device: Device) -> None:
        super().__init__(device)
        self._pkey = load_private_key(device)
        self._client: paramiko.SSHClient | None = None
        self._sftp_client: paramiko.SFTPClient | None = None
        self._connect()

    # -- connection ---------------------------------------------------------------------------

    def _connect(self) -> None:
        delay = FIRST_BACKOFF_S
        for attempt in range(1, self.device.connect_retries + 1):
            try:
                self._client = self._connect_once()
                return
            except TRANSIENT as exc:
                if attempt == self.device.connect_retries:
                    raise DeviceUnreachable(
                        self.device.name,
                        f"cannot connect to {self.device.address} after {attempt} attempts: "
                        f"{exc or type(exc).__name__}",
                    ) from exc
                time.sleep(delay)
                delay *= 2

    def _connect_once(self) -> paramiko.SSHClient:
        device = self.device
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(_CheckKnownHosts(device))
        sock = _open_socket(device)
        try:
            client.connect(
                hostname=device.host, port=device.port, username=device.user, pkey=self._pkey,
                sock=sock,
                timeout=device.connect_timeout, banner_timeout=device.connect_timeout,
                auth_timeout=device.connect_timeout, channel_timeout=device.connect_timeout,
                allow_agent=False, look_for_keys=self._pkey is None,
                transport_factory=_transport_factory(device),
            )
        except paramiko.AuthenticationException as exc:
            client.close()
            raise AuthFailed(device.name, f"{device.address} refused authentication "
                                          f"(key {device.key or '~/.ssh default'}): {exc}") from exc
        except BaseException:
            client.close()
            sock.close()
            raise
        if device.keepalive_s:
            client.get_transport().set_keepalive(device.keepalive_s)
        return client

    def _live_client(self) -> paramiko.SSHClient:
        """The connection, re-established if it dropped since the last command."""
        transport = self._client.get_transport() if self._client else None
        if transport is None or not transport.is_active():
            self.close()
            self._connect()
        return self._client

    def _sftp(self) -> paramiko.SFTPClient:
        client = self._live_client()
        if self._sftp_client is None or self._sftp_client.get_channel().closed:
            self._sftp_client = client.open_sftp()
            self._sftp_client.get_channel().settimeout(SFTP_STALL_S)
        return self._sftp_client

    def close(self) -> None:
        if self._sftp_client is not None:
            self._sftp_client.close()
            self._sftp_client = None
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- commands -----------------------------------------------------------------------------

    def run_host(self, argv: list[str], timeout: float,
                 stdin_file: Path | None = None) -> CommandResult:
        command = remote_shell_command(self.device.workdir, list(map(str, argv)), timeout)
        start = time.monotonic()
        try:
            channel = self._live_client().get_transport().open_session(
                timeout=self.device.connect_timeout)
            channel.exec_command(command)
            if stdin_file is not None:
                with open(stdin_file, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 16), b""):
                        channel.sendall(chunk)
            channel.shutdown_write()
            exit_code, out, err = self._collect(channel, describe(argv), start + timeout + GRACE_S)
        except DeviceError:
            raise
        except TRANSIENT as exc:
            message = (f"connection to {self.device.address} lost while running "
                       f"`{describe(argv)}`: {exc}")
            raise DeviceUnreachable(self.device.name, message) from exc
        wall = time.monotonic() - start
        if exit_code in TIMEOUT_EXIT_CODES and wall >= timeout:
            raise CommandTimeout(self.device.name, f"`{describe(argv)}` ran past its {timeout:g} s "
                                                   "timeout; its process group was killed")
        return CommandResult(exit_code, out.decode(errors="replace"),
                             err.decode(errors="replace"), wall)

    def _collect(self, channel: paramiko.Channel, what: str,
                 deadline: float) -> tuple[int, bytes, bytes]:
        """Read stdout/stderr until the command exits, the deadline passes or the link dies."""
        out, err = bytearray(), bytearray()
        channel.settimeout(POLL_S)
        stdout_open = True
        while True:
            if stdout_open:
                try:
                    data = channel.recv(1 << 16)
                    keep_capped(out, data)
                    stdout_open = bool(data)
                except TimeoutError:
                    pass
            while channel.recv_stderr_ready():
                keep_capped(err, channel.recv_stderr(1 << 16))
            if not stdout_open and channel.exit_status_ready():
                break
            if not stdout_open:
                channel.status_event.wait(POLL_S)
            if time.monotonic() > deadline:
                channel.close()
                raise CommandTimeout(self.device.name, f"`{what}` gave no exit status before "
                                                       "its deadline; the channel was closed")
        while channel.recv_stderr_ready():
            err += channel.recv_stderr(1 << 16)
        transport = channel.get_transport()
        if channel.exit_status == -1 and (transport is None or not transport.is_active()):
            raise DeviceUnreachable(self.device.name, f"connection to {self.device.address} "
                                                      f"lost while running `{what}`")
        return channel.exit_status, bytes(out), bytes(err)

    # -- files --------------------------------------------------------------------------------

    def upload(self, local_path: Path, remote_path: str) -> int:
        try:
            self._sftp().put(str(local_path), remote_path, confirm=True)
        except TRANSIENT as exc:
            if self._connected():
                raise TransferFailed(self.device.name, f"cannot upload {local_path} to "
                                                       f"{remote_path}: {exc}") from exc
            raise DeviceUnreachable(self.device.name, f"connection lost while pushing "
                                                      f"{local_path}: {exc}") from exc
        return local_path.stat().st_size

    def fetch(self, remote_path: str) -> bytes:
        path = posixpath.join(self.device.workdir, remote_path)
        try:
            with self._sftp().open(path, "rb") as f:
                f.prefetch()  # pipelined reads: much faster than one request at a time
                return f.read()
        except TRANSIENT as exc:
            if self._connected():
                raise TransferFailed(self.device.name, f"cannot fetch {path}: {exc}") from exc
            raise DeviceUnreachable(self.device.name, f"connection lost while fetching "
                                                      f"{path}: {exc}") from exc

    def _connected(self) -> bool:
        transport = self._client.get_transport() if self._client else None
        return transport is not None and transport.is_active()


def trust_device(device: Device, replace: bool = False,
                 expect: str | None = None) -> tuple[paramiko.PKey, str]:
    """Fetch the device's host key and append it to its known_hosts file.

    Returns (key, what happened: "recorded", "replaced" or "already trusted"). A key that differs
    from the recorded ones is only added with ``replace``, which also appends an ``@revoked``
    line for each key recorded for the host before (the file is never rewritten); ``expect``
    (a SHA256:... fingerprint obtained out of band, e.g. from the board's console) must match
    when given. A key the file marks ``@revoked`` is refused: only removing that line by hand
    trusts it again.
    """
    key = fetch_host_key(device)
    fingerprint = key_fingerprint(key)
    presented = f"{key.get_name()} {fingerprint}"
    if expect is not None and expect != fingerprint:
        raise HostKeyMismatch(device.name, f"{device.address} presented {presented}, expected "
                                           f"{expect}; not recorded")
    verdict = _check(device, key)
    if verdict.status == "known":
        return key, "already trusted"
    if verdict.recorded and not replace:
        raise HostKeyMismatch(device.name, f"{device.address} presented {presented} but "
                                           f"{device.known_hosts} records {_recorded(verdict)}; "
                                           "pass --replace if the board was reinstalled")
    name = known_hosts_name(device)
    old = {(e.key_type, e.blob) for e in verdict.recorded}
    lines = [known_hosts.entry_line(name, t, blob, "@revoked") for t, blob in sorted(old)]
    _append(device, [*lines, known_hosts.entry_line(name, key.get_name(), key.asbytes())])
    return key, "replaced" if verdict.recorded else "recorded"
