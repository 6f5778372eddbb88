"""The local farm: real OpenSSH ``sshd`` processes on loopback addresses, so that tests and the
demo take the same path as a lab of boards.

Three nodes: ``farm-x86`` (x86_64), ``farm-arm`` (aarch64, every run under
``qemu-aarch64-static -cpu cortex-a76``, marked emulated: an RK3588 with the dot-product
extension) and ``farm-a72`` (the same under ``-cpu cortex-a72``: a board without it, which gets
the armv8-a build, devices.isa). Each node is one ``sshd -D`` with its
own config, host key, log and workdir under the state directory; one client key is authorised
for all of them. ``farm_up`` writes ``inventory.toml`` and a ``known_hosts`` with the host keys
it generated (it knows them first-hand, so nothing is trusted blindly).

``farm.json`` records each sshd's pid and kernel start time, so ``farm_down`` stops exactly the
processes the farm started (the sshd and the session processes under it), never a recycled pid.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from devices import procs
from devices.errors import FarmError
from devices.farm_state import NodeState, is_ours, read_state, state_file, write_state
from devices.inventory import DEFAULT_STATE_DIR, device_table

QEMU_AARCH64 = ["qemu-aarch64-static", "-cpu", "cortex-a76"]
# a board without the dot-product extension (a Raspberry Pi 4): it gets the armv8-a build
QEMU_A72 = ["qemu-aarch64-static", "-cpu", "cortex-a72"]
READY_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class NodeSpec:
    name: str
    address: str
    arch: str
    cls: str
    exec_prefix: tuple[str, ...] = ()
    emulated: bool = False


NODES = (
    NodeSpec("farm-x86", "127.0.1.10", "x86_64", "x86"),
    NodeSpec("farm-arm", "127.0.1.11", "aarch64", "rk3588", tuple(QEMU_AARCH64), emulated=True),
    NodeSpec("farm-a72", "127.0.1.12", "aarch64", "rpi4", tuple(QEMU_A72), emulated=True),
)


@dataclass
class NodeStatus:
    name: str
    address: str
    port: int
    pid: int | None
    running: bool


def default_state_dir() -> Path:
    return DEFAULT_STATE_DIR


# ---------------------------------------------------------------------------------------------
# State directory
# ---------------------------------------------------------------------------------------------


def _keygen(path: Path) -> None:
    if path.exists() and path.with_suffix(".pub").exists():
        return
    path.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name,
                    "-f", str(path)], check=True, capture_output=True, timeout=30)


def _sshd_binary() -> str:
    found = shutil.which("sshd", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    if not found:
        raise FarmError("sshd not found; install openssh-server (scripts/setup.sh does)")
    return os.path.abspath(found)  # sshd re-executes itself and insists on an absolute path


def _free_port(address: str, preferred: int | None) -> int:
    for port in ([preferred] if preferred else []) + [0]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # As sshd does: connections of a killed sshd in TIME_WAIT must not cost the port.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((address, port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise FarmError(f"no free port on {address}")


def _config_path(path: Path, tokens: bool = False) -> str:
    """A path as one sshd_config argument: double-quoted (a space would split it), with ``%``
    doubled where sshd expands %-tokens; quotes, backslashes and line breaks cannot be written."""
    text = str(path)
    if any(c in text for c in '"\\\n\r'):
        raise FarmError(f"--state {path}: the path holds a quote, backslash or line break, "
                        "which an sshd_config cannot hold; choose another state directory")
    return '"' + (text.replace("%", "%%") if tokens else text) + '"'


def _sshd_config(state_dir: Path, spec: NodeSpec, port: int) -> str:
    node_dir = state_dir / "nodes" / spec.name
    return "\n".join([
        f"ListenAddress {spec.address}:{port}",
        f"HostKey {_config_path(node_dir / 'ssh_host_ed25519_key')}",
        f"PidFile {_config_path(node_dir / 'sshd.pid')}",
        f"AuthorizedKeysFile {_config_path(state_dir / 'authorized_keys', tokens=True)}",
        "AuthenticationMethods publickey",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "UsePAM no",
        "StrictModes no",  # the state dir may live anywhere (a pytest tmp dir)
        "UseDNS no",
        # sshd runs every command through the user's login shell; Debian's bash then sources
        # ~/.bashrc (slow here: root's runs `pyenv init`, ~250 ms per command) unless it sees
        # itself as a nested shell. SHLVL=1 makes it one; other shells ignore the variable.
        "SetEnv SHLVL=1",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "AllowTcpForwarding no",
        "PermitTunnel no",
        "MaxStartups 64",
        "MaxSessions 32",
        "ClientAliveInterval 15",
        "Subsystem sftp internal-sftp",
        "LogLevel INFO",
        "",
    ])


def _config_current(state_dir: Path, spec: NodeSpec, port: int) -> bool:
    config = state_dir / "nodes" / spec.name / "sshd_config"
    try:
        return config.read_text() == _sshd_config(state_dir, spec, port)
    except OSError:
        return False


def _wait_ready(proc: subprocess.Popen, spec: NodeSpec, port: int, log: Path) -> None:
    """Until sshd answers with its SSH banner; fails with the log's tail if it exits."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            raise FarmError(f"sshd for {spec.name} exited with {proc.returncode}: "
                            + " | ".join(tail))
        try:
            with socket.create_connection((spec.address, port), timeout=1.0) as s:
                if s.recv(4) == b"SSH-":
                    return
        except OSError:
            pass
        time.sleep(0.05)
    procs.stop_tree(proc.pid, STOP_TIMEOUT_S)
    raise FarmError(f"sshd for {spec.name} did not answer on {spec.address}:{port} within "
                    f"{READY_TIMEOUT_S:g} s; see {log}")


def _start_node(state_dir: Path, spec: NodeSpec, preferred_port: int | None,
                with_caller: bool) -> NodeState:
    node_dir = state_dir / "nodes" / spec.name
    (node_dir / "work").mkdir(parents=True, exist_ok=True)
    _keygen(node_dir / "ssh_host_ed25519_key")
    port = _free_port(spec.address, preferred_port)
    config = node_dir / "sshd_config"
    config.write_text(_sshd_config(state_dir, spec, port))
    log = node_dir / "sshd.log"
    with log.open("ab") as log_file:
        proc = subprocess.Popen([_sshd_binary(), "-D", "-e", "-f", str(config)],
                                stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                                start_new_session=True,
                                preexec_fn=procs.ending_with_caller() if with_caller else None)
    procs.adopt(proc)
    _wait_ready(proc, spec, port, log)
    return NodeState(spec.name, spec.address, port, proc.pid, procs.start_ticks(proc.pid))


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    """One farm operation at a time per state directory (two test processes, a demo, ...)."""
    with (state_dir / ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------
# Public operations
# ---------------------------------------------------------------------------------------------


def farm_up(state_dir: Path | str | None = None, with_caller: bool = False) -> Path:
    """Start every node that is not already running; returns the inventory path. Idempotent.
    ``with_caller``: the nodes it starts end (SIGTERM) when the calling thread does, however
    it ends (a test session's farm, even when the session is SIGKILLed); otherwise they run
    until ``farm_down``."""
    state_dir = Path(state_dir or default_state_dir()).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    except OSError as exc:
        raise FarmError(f"cannot create /run/sshd ({exc.strerror}); the local farm runs sshd "
                        "and needs root") from exc
    with _locked(state_dir):
        _keygen(state_dir / "client_ed25519")
        (state_dir / "authorized_keys").write_text((state_dir / "client_ed25519.pub").read_text())

        nodes = read_state(state_dir)
        for spec in NODES:
            old = nodes.get(spec.name)
            if old is not None and is_ours(old):
                if _config_current(state_dir, spec, old.port):
                    continue
                # Started by an older benchfarm with another sshd_config: restart it as now.
                procs.stop_tree(old.pid, STOP_TIMEOUT_S)
            nodes[spec.name] = _start_node(state_dir, spec, old.port if old else None,
                                           with_caller)
            write_state(state_dir, nodes)  # after each start, so a failure leaves no orphan
        _write_known_hosts(state_dir, nodes)
        return _write_inventory(state_dir, nodes)


def farm_status(state_dir: Path | str | None = None) -> list[NodeStatus]:
    state_dir = Path(state_dir or default_state_dir()).resolve()
    nodes = read_state(state_dir)
    out = []
    for spec in NODES:
        node = nodes.get(spec.name)
        if node is None:
            out.append(NodeStatus(spec.name, spec.address, 0, None, False))
        else:
            out.append(NodeStatus(spec.name, node.address, node.port, node.pid, is_ours(node)))
    return out


def stop_node(state_dir: Path | str, name: str, sig: int = signal.SIGTERM) -> list[int]:
    """Stop one node's sshd and its sessions (SIGKILL simulates a crash); returns the pids."""
    state_dir = Path(state_dir).resolve()
    node = read_state(state_dir).get(name)
    if node is None or not is_ours(node):
        return []
    if sig == signal.SIGKILL:
        return procs.kill_tree(node.pid)
    return procs.stop_tree(node.pid, STOP_TIMEOUT_S)


def farm_down(state_dir: Path | str | None = None) -> list[int]:
    """Stop exactly the processes this farm started; returns their pids. Keeps keys and logs."""
    state_dir = Path(state_dir or default_state_dir()).resolve()
    if not state_dir.is_dir():
        return []
    with _locked(state_dir):
        stopped = []
        for node in read_state(state_dir).values():
            if is_ours(node):
                stopped += procs.stop_tree(node.pid, STOP_TIMEOUT_S)
            else:
                procs.reap(node.pid)
        state_file(state_dir).unlink(missing_ok=True)
        return stopped


def _write_known_hosts(state_dir: Path, nodes: dict[str, NodeState]) -> None:
    lines = []
    for spec in NODES:
        node = nodes[spec.name]
        pub = (state_dir / "nodes" / spec.name / "ssh_host_ed25519_key.pub").read_text().split()
        lines.append(f"[{node.address}]:{node.port} {pub[0]} {pub[1]}\n")
    (state_dir / "known_hosts").write_text("".join(lines))


def _write_inventory(state_dir: Path, nodes: dict[str, NodeState]) -> Path:
    user = getpass.getuser()
    parts = ["# Written by `benchfarm farm up`; rewritten on every start.\n"]
    for spec in NODES:
        node = nodes[spec.name]
        fields = {
            "name": spec.name,
            "host": node.address,
            "port": node.port,
            "user": user,
            "key": str(state_dir / "client_ed25519"),
            "known_hosts": str(state_dir / "known_hosts"),
            "arch": spec.arch,
            "class": spec.cls,
            "workdir": str(state_dir / "nodes" / spec.name / "work"),
            "exec_prefix": list(spec.exec_prefix),
            "emulated": spec.emulated,
            "connect_timeout": 5.0,
            "connect_retries": 2,
        }
        parts.append(device_table(fields))
    path = state_dir / "inventory.toml"
    path.write_text("".join(parts))
    return path
