"""A real two-node Ray cluster on this machine, for the multi-node tests and the transfer bench.

The head node runs as usual; the worker node runs in a mount namespace of its own
(``unshare --mount``) with an empty tmpfs over the work tree and over every other folder the
caller names (e.g. the farm's keys), so it cannot read the coordinator's files: code reaches it
through ``runtime_env``, artifacts through Ray, SSH keys with the device records. Only the
virtual environment is bound back into the hidden work tree, so that the node has a Python.

The cluster is private: its own ``--temp-dir`` (Ray writes ``ray_current_cluster`` there, not in
/tmp/ray, so no plain ``ray.init()`` can join it by accident), free ports on loopback addresses,
token authentication with a token of its own, and each node is one ``ray start --block`` in a
session of its own, so tear-down signals exactly those process groups.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from devices.procs import descendants

REPO = Path(__file__).resolve().parents[1]
VENV = Path(sys.prefix)
RAY = VENV / "bin" / "ray"
HEAD_IP, WORKER_IP = "127.0.14.1", "127.0.14.2"
START_TIMEOUT_S = 90.0


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass
class TwoNodeCluster:
    base: Path  # node temp dirs, caches and logs live here
    hidden: list[Path]  # folders the worker node must not see (the work tree is always one)
    token: str = field(default_factory=lambda: secrets.token_hex(32))
    address: str = ""
    # Ray's temp dirs: short paths, Ray's socket paths must stay under 108 bytes
    ray_dirs: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="bf-ray-")))
    procs: list[subprocess.Popen] = field(default_factory=list)
    worker: subprocess.Popen | None = None

    def node_cache(self, node: str) -> Path:
        """The node-local artifact cache of ``node`` ("head" or "worker")."""
        return self.base / f"{node}-cache"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a driver that joins this cluster (with its token)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        return env | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token} | extra

    def _ray_start(self, node: str, ip: str, resources: str, head: bool) -> list[str]:
        argv = [str(RAY), "start", "--block", "--disable-usage-stats",
                f"--node-ip-address={ip}", f"--temp-dir={self.ray_dirs / node}",
                "--num-cpus=1", f"--resources={resources}",
                f"--dashboard-agent-listen-port={free_port(ip)}",
                "--object-store-memory=100000000"]
        if head:
            return [*argv, "--head", f"--port={self.address.rpartition(':')[2]}",
                    "--include-dashboard=false", f"--ray-client-server-port={free_port(ip)}"]
        return [*argv, f"--address={self.address}"]

    def _spawn(self, node: str, argv: list[str], marker: str) -> None:
        log = self.base / f"{node}.log"
        env = self.env(BENCHFARM_NODE_CACHE=str(self.node_cache(node)))
        with log.open("w") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True, cwd=self.base)
        self.procs.append(proc)
        deadline = time.monotonic() + START_TIMEOUT_S
        while marker not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Ray {node} node did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)

    def start(self) -> None:
        self.start_head()
        self.start_worker()

    def start_head(self) -> None:
        self.address = f"{HEAD_IP}:{free_port(HEAD_IP)}"
        ready = "will now block forever"
        self._spawn("head", self._ray_start("head", HEAD_IP, '{"node_head": 1}', True), ready)

    def start_worker(self) -> None:
        """The worker node (again, after ``kill_worker_raylet``: a new node, the same view)."""
        # Bind the venv aside, hide the work tree (and the rest) under tmpfs, bind it back.
        view = self.base / "venv-view"
        view.mkdir(exist_ok=True)
        hide = " && ".join(f"mount -t tmpfs tmpfs {shlex.quote(str(p))}"
                           for p in [REPO, *self.hidden])
        worker = self._ray_start("worker", WORKER_IP, '{"node_worker": 1}', False)
        script = (f"mount --bind {shlex.quote(str(VENV))} {shlex.quote(str(view))} && {hide} && "
                  f"mkdir -p {shlex.quote(str(VENV))} && "
                  f"mount --bind {shlex.quote(str(view))} {shlex.quote(str(VENV))} && "
                  f"exec {shlex.join(worker)}")
        self._spawn("worker", ["unshare", "--mount", "sh", "-c", script],
                    "will now block forever")
        self.worker = self.procs[-1]

    def kill_worker_raylet(self) -> int:
        """SIGKILL the worker node's raylet (a lost node); its `ray start` then stops the rest
        of the node. Returns the raylet's pid."""
        for pid in [self.worker.pid, *descendants(self.worker.pid)]:
            try:
                argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if argv0.endswith(b"/raylet"):
                os.kill(pid, signal.SIGKILL)
                return pid
        raise RuntimeError("the worker node has no raylet")

    def stop_worker(self) -> None:
        """Stop what is left of the worker node (its process group)."""
        _stop_group(self.worker)
        self.procs.remove(self.worker)

    def stop(self) -> None:
        """Stop both nodes: SIGTERM to each node's process group, SIGKILL what remains."""
        for proc in reversed(self.procs):
            _stop_group(proc)
        self.procs.clear()
        shutil.rmtree(self.ray_dirs, ignore_errors=True)


def _stop_group(proc: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _group_alive(proc.pid):
            proc.poll()
            time.sleep(0.1)
    proc.poll()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _started(cluster: TwoNodeCluster) -> TwoNodeCluster:
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def start_cluster(base: Path, hidden: list[Path], token: str | None = None,
                  tries: int = 3) -> TwoNodeCluster:
    """Start the cluster, again when a node did not come up: Ray gives a raylet a fixed 30 s to
    register, which a machine busy with other jobs can exceed (seen at load average 20+)."""
    token = token or secrets.token_hex(32)
    for _ in range(tries - 1):
        try:
            return _started(TwoNodeCluster(base, hidden, token))
        except RuntimeError:
            continue
    return _started(TwoNodeCluster(base, hidden, token))


@pytest.fixture(scope="module")
def two_node_cluster(tmp_path_factory: pytest.TempPathFactory,
                     coord_farm: object) -> Iterator[TwoNodeCluster]:
    """Head + worker node; the worker cannot see the work tree nor the farm's state (keys)."""
    cluster = start_cluster(tmp_path_factory.mktemp("cluster"), [coord_farm.state])
    try:
        yield cluster
    finally:
        cluster.stop()
