"""What one run does on a device: the board's runner actor and what it does for one order.

This is the device side of a run (harness.contract has the protocol): a ``DeviceRunner`` actor
per board holds its connection; ``localise`` materialises an order's artifacts in the node's
cache, ``execute`` pushes the engine binary and the model into the device's content-addressed
cache (``PushMemo``: once per connection), takes a fingerprint, runs the engine with the argv
its adapter makes (``harness.engines``) and the prompt ids on its standard input, takes a
second fingerprint, and has the adapter check the engine's output (board output is untrusted)
and collect what the run left on the board. It returns a plain ``RunReport``; mapping that
into database records is the driver's (``harness.execution.results``), which is the only
writer. Nothing here knows the plan or an engine by name.

A transport error (board lost) is reported as status ``lost`` so that the scheduler can retry
elsewhere; an engine that exits non-zero, outlives its timeout, or prints a document its
adapter refuses is a ``failed`` run with its exit code and stderr, or the reason. Every command
runs under the board's lock file (devices.boardlock), recording this coordinator, store, job
and run as its holder; one that finds it taken by another coordinator is reported ``busy``,
having run nothing, and the scheduler tries later. ``DeviceRunner.abort`` (a concurrency group
of its own, so that it runs while a run is in flight) kills a run's whole session on the board
over a connection of its own: the coordinator calls it when it stops (cancel, SIGTERM/Ctrl-C)
or loses the board's lease; a run that outlives its timeout is aborted the same way.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ray

from devices.boardlock import LockHolder, abort_argv, check_locked, locked
from devices.cache import ArtifactCache
from devices.connect import connect
from devices.errors import BoardLocked, CommandTimeout, DeviceError
from devices.fingerprint import probed_run
from devices.inventory import Device
from devices.isa import board_features
from devices.transport import Transport, device_argv
from harness.contract import (
    STDERR_KEEP,
    OutputRefused,
    RunReport,
    WorkOrder,
    kept_stdout,
)
from harness.engines import adapter_of
from harness.execution.artifacts import ArtifactError, ArtifactMismatch, NodeCache
from harness.execution.cluster import NAMESPACE
from harness.execution.credentials import Credentials
from harness.plan.planner import PlannedRun

ABORT_TIMEOUT_S = 15.0  # the kill script: TERM, 2 s, KILL, 2 s, and the round trip


class PushMemo:
    """Artifacts already pushed through one connection, by sha256.

    The device's cache verifies an artifact's hash when it is pushed, and the push is checked
    against the hash the run planned; within one connection an artifact used by every run is
    pushed (and verified) once instead of once per run. A new connection (after a board was
    lost) starts a new memo.
    """

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.cache = ArtifactCache(transport)  # what this connection verified and pushed
        self.remote: dict[str, str] = {}

    def push(self, path: Path, sha256: str, tree: bool = False) -> str:
        if sha256 not in self.remote:
            cache = self.cache
            remote = cache.push_tree(path) if tree else cache.push(path)
            pushed = cache.last_push.sha256 if cache.last_push else "nothing"
            if pushed != sha256:
                raise ArtifactMismatch(
                    f"{path}: what was pushed to device {cache.device!r} has sha256 "
                    f"{pushed}, the run planned {sha256}: refused, the engine was not run")
            self.remote[sha256] = remote
        return self.remote[sha256]


def localise(order: WorkOrder, cache: NodeCache) -> WorkOrder:
    """The order with its artifacts materialised (by hash) in this node's cache."""
    binary = cache.blob(order.binary_sha256, f"engine binary {Path(order.binary).name}")
    model = None
    if order.model_sha256 is not None and order.model_dir is not None:
        name = f"model {Path(order.model_dir).name}"
        model = str(cache.blob(order.model_sha256, name) if order.model_file
                    else cache.tree(order.model_sha256, name))
    extra = order.extra_file
    if order.extra_file is not None and order.extra_sha256 is not None:
        what = str(order.extra_flag).lstrip("-")  # "predictor" for --predictor
        extra = str(cache.blob(order.extra_sha256, f"{what} {Path(order.extra_file).name}"))
    return replace(order, binary=str(binary), model_dir=model, extra_file=extra)


def write_ids(ids: tuple[int, ...], folder: Path) -> Path:
    """The ids as a whitespace-separated file of this run's own (``execute`` removes it; one
    whose process was killed first, ``scratch_dir`` does), named by this process's id."""
    handle, name = tempfile.mkstemp(prefix=f"ids-{os.getpid()}-", suffix=".txt", dir=folder)
    with os.fdopen(handle, "w") as out:
        out.write(" ".join(map(str, ids)) + "\n")
    return Path(name)


def abort_run(transport: Transport, run: str) -> bool:
    """Kill ``run``'s session on the board if it still holds the lock file; whether it did."""
    result = transport.run_host(abort_argv(run), timeout=ABORT_TIMEOUT_S)
    return result.stdout.strip() == "aborted"


def execute(order: WorkOrder, device_name: str, pushes: PushMemo, scratch: Path,
            holder: LockHolder) -> RunReport:
    """Run ``order`` on the device of ``pushes.transport`` (see ``run_order``); its token ids
    go through a file in ``scratch`` that lives as long as the run."""
    ids = write_ids(order.ids, scratch) if order.ids is not None else None
    try:
        return run_order(order, device_name, pushes, ids, holder)
    finally:
        if ids is not None:
            ids.unlink(missing_ok=True)


def run_order(order: WorkOrder, device_name: str, pushes: PushMemo, ids: Path | None,
              holder: LockHolder) -> RunReport:
    """Run ``order`` on the device of ``pushes.transport``, between two fingerprints.

    The fingerprints and the engine go in one remote command (``probed_run``), whose engine
    wall time is taken on the device. Warm-ups run the engine alone. A command that outlives
    its timeout is a failed run (the engine hung, the board answered); any other device error
    means the board was lost, and the run may be retried.
    """
    started = datetime.now(UTC)
    clock = time.perf_counter()
    report = RunReport(order.run_key, device_name, "lost", started, started, 0.0)
    transport = pushes.transport
    adapter = adapter_of(order.engine)
    try:
        lacking = sorted(set(order.isa_features) - board_features(transport.device, transport))
        if lacking:  # never start a binary the board's CPU cannot execute
            report.status = "failed"
            report.error = (f"board {device_name!r} lacks {', '.join(lacking)}, which the "
                            f"{order.engine} binary's instruction-set level needs; not started")
            return _finish(report, clock)
        model = None
        if order.model_dir is not None and order.model_sha256 is not None:
            # a model folder, or one file (a GGUF for llama-bench)
            model = pushes.push(Path(order.model_dir), order.model_sha256,
                                tree=not order.model_file)
        # the token ids (file ``ids``) travel as the command's standard input: a prompt is
        # small and often new, and pushing it into the device cache would cost round trips
        binary = pushes.push(Path(order.binary), order.binary_sha256)
        options = order.options
        if order.extra_file is not None and order.extra_sha256 is not None:
            options += (str(order.extra_flag),
                        pushes.push(Path(order.extra_file), order.extra_sha256))
        argv = adapter.argv(order.command, binary, model, ids is not None, options)
        if order.warmup:
            device = transport.device
            result = transport.run_host(locked(device_argv(device, argv, None), holder),
                                        timeout=order.timeout_s, stdin_file=ids)
            check_locked(device.name, device.workdir, result)
        else:
            probed = probed_run(transport, argv, timeout=order.timeout_s, stdin_file=ids,
                                lock=holder, cache=pushes.cache)
            result = probed.result
            report.snapshots = {"before": probed.before, "after": probed.after}
    except CommandTimeout as exc:
        try:  # whatever of the run's session outlived the deadline goes now
            abort_run(transport, holder.run)
        except DeviceError:
            pass
        report.status, report.error = "failed", str(exc)
        return _finish(report, clock)
    except ArtifactError as exc:
        report.status, report.error = "failed", str(exc)
        return _finish(report, clock)
    except BoardLocked as exc:
        report.status, report.error = "busy", str(exc)
        return _finish(report, clock)
    except DeviceError as exc:
        report.error = str(exc)
        return _finish(report, clock)
    report.exit_code = result.exit_code
    report.engine_ms = round(result.wall_s * 1000.0, 3)
    report.stdout = kept_stdout(result.stdout)  # all of it once accepted
    if result.exit_code != 0:
        report.status = "failed"
        report.error = (result.stderr or "").strip()[-STDERR_KEEP:] or \
            f"{order.engine} exited with code {result.exit_code} and printed nothing on stderr"
        return _finish(report, clock)
    # checked here, on the device side: the driver only ever sees a valid document
    try:
        report.engine_json = adapter.parse(result.stdout, order.command)
        if not order.warmup:
            adapter.collect(transport, order, report.engine_json)
    except OutputRefused as exc:
        report.status, report.error = "failed", str(exc)
        return _finish(report, clock)
    except ValueError as exc:  # json.JSONDecodeError is one
        report.status = "failed"
        report.error = f"{order.engine} printed no valid output ({exc}): {result.stdout[:200]!r}"
        return _finish(report, clock)
    report.status, report.stdout = "ok", result.stdout
    return _finish(report, clock)


def _finish(report: RunReport, clock: float) -> RunReport:
    report.finished_at = datetime.now(UTC)
    report.wall_ms = round((time.perf_counter() - clock) * 1000.0, 3)
    return report


def scratch_dir() -> Path:
    """This node's folder for the runs' id files, without the files of processes that are no
    longer alive (a runner actor killed mid-run runs no clean-up)."""
    path = Path(tempfile.gettempdir()) / "benchfarm-scratch"
    path.mkdir(exist_ok=True)
    for left in path.glob("ids-*-*.txt"):
        pid = left.name.split("-")[1]
        if pid.isdigit() and not alive(int(pid)):
            left.unlink(missing_ok=True)
    return path


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@ray.remote(num_cpus=0, max_concurrency=1, concurrency_groups={"control": 1})
class DeviceRunner:
    """Holds the connection to one board and runs work orders on it, one at a time.

    It may live on any node: the SSH credentials come with it, and each order's artifacts are
    fetched by hash into the node's cache (``harness.execution.artifacts``) before they are
    pushed. ``holder`` names the coordinator in the board's lock file (its ``run`` is filled
    per order).
    """

    def __init__(self, device: Device, credentials: Credentials, server: Any,
                 holder: LockHolder) -> None:
        self.device, self.secrets = credentials.install(device)
        self.cache = NodeCache(server)
        self.holder = holder
        self.transport: Any = None
        self.pushes: PushMemo | None = None

    @ray.method(concurrency_group="control")
    def forget_credentials(self) -> None:
        """Remove this node's copy of the board's key and known_hosts (the scheduler calls it
        before it kills the actor: ray.kill runs no clean-up of the actor's own)."""
        if self.secrets is not None:
            shutil.rmtree(self.secrets, ignore_errors=True)
            self.secrets = None

    @ray.method(concurrency_group="control")
    def abort(self, run_key: str) -> bool:
        """Kill the run's session on the board (while ``run`` may still wait for it), over a
        connection of its own; whether something was killed."""
        try:
            with connect(self.device) as transport:
                return abort_run(transport, run_key)
        except DeviceError:
            return False

    def run(self, order: WorkOrder) -> RunReport:
        started = datetime.now(UTC)
        try:
            order = localise(order, self.cache)
        except ArtifactError as exc:  # not the board's fault: the run fails, the board stays
            return RunReport(order.run_key, self.device.name, "failed", started,
                             datetime.now(UTC), 0.0, error=str(exc))
        if self.transport is None:
            try:
                self.transport = connect(self.device)
                self.pushes = PushMemo(self.transport)
            except DeviceError as exc:
                return RunReport(order.run_key, self.device.name, "lost", started,
                                 datetime.now(UTC), 0.0, error=str(exc))
        try:
            report = execute(order, self.device.name, self.pushes, scratch_dir(),
                             replace(self.holder, run=order.run_key))
        except Exception as exc:  # noqa: BLE001 - an untyped transport failure: the board is
            # as good as lost; the error text goes with the run so that a bug stays visible.
            now = datetime.now(UTC)
            report = RunReport(order.run_key, self.device.name, "lost", now, now, 0.0,
                               error=f"device {self.device.name!r}: {type(exc).__name__}: {exc}")
        if report.status == "lost":  # reconnect for the next order
            self.close()
        return report

    def close(self) -> None:
        if self.transport is not None:
            try:
                self.transport.close()
            except Exception:  # noqa: BLE001 - closing a broken connection may fail any way
                pass
            self.transport = self.pushes = None


# ---------------------------------------------------------------------------------------------
# The driver's side: a board as the scheduler holds it, its runner started and retired
# ---------------------------------------------------------------------------------------------

# how long a stopping scheduler waits for its runners to remove their copies of credentials
RETIRE_WAIT_S = 5.0


def start_runner(device: Device, server: Any, name: str, holder: LockHolder) -> Any:
    """The board's actor, named in the ``benchfarm`` namespace, placed on a node that declares
    the board's custom resources."""
    options: dict[str, Any] = {"resources": dict(device.resources)} if device.resources else {}
    return DeviceRunner.options(name=name, namespace=NAMESPACE, **options).remote(
        device, Credentials.of(device), server, holder)


def retire(actors: list[Any]) -> None:
    """Have the runners remove their nodes' copies of their boards' credentials, then kill
    them; one that is gone, or not placed, or does not answer in RETIRE_WAIT_S is killed as it
    is."""
    forgetting = [actor.forget_credentials.remote() for actor in actors]
    if forgetting:
        ray.wait(forgetting, num_returns=len(forgetting), timeout=RETIRE_WAIT_S)
    for actor in actors:
        ray.kill(actor)


@dataclass
class Dispatch:
    ref: Any
    run: PlannedRun
    warmup: bool
    aborted: bool = False  # its lease was lost and the run killed on the board


@dataclass
class Board:
    device: Device
    actor: Any
    serves: list[str]  # placement keys, pinned first
    busy: Dispatch | None = None
    not_before: float = 0.0
    losses: int = 0  # consecutive
    dead: bool = False
    last_error: str = ""
    generation: int = 0  # runners started for the board (each has a name of its own)
    starting: Any = None  # a new runner's readiness, until it is placed
    starting_since: float = 0.0
    warmed: Counter[str] = field(default_factory=Counter)  # warm-up group -> warm-ups done
