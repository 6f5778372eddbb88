"""What one run does on a device, through a transport.

This is the device side of a run, what runs inside a DeviceRunner actor (or `reproduce`):
``localise`` materialises a job's artifacts in the node's cache, ``execute`` pushes the engine
binary and the model into the device's content-addressed cache (``PushMemo``: once per
connection), takes a fingerprint, runs the engine with the argv its adapter makes
(``harness.engines``) and the prompt ids on its standard input, takes a second fingerprint,
and has the adapter check the engine's output (board output is untrusted). It returns a plain
``RunReport``; mapping that into database records is the driver's (``harness.results``), which
is the only writer. Nothing here knows the plan.

A transport error (board lost, timeout) is reported as status ``lost`` so that the scheduler can
retry elsewhere; an engine that exits non-zero, or prints a document outside the schema, is a
``failed`` run with its exit code and stderr, or the reason the document was refused.
Every command runs under the board's lock file (devices.boardlock); one that finds it taken by
another coordinator is reported ``busy``, having run nothing, and the scheduler tries later.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from devices.boardlock import check_locked, locked
from devices.cache import ArtifactCache
from devices.errors import BoardLocked, CommandTimeout, DeviceError
from devices.fingerprint import probed_run
from devices.transport import Transport, device_argv
from harness import engine_output
from harness.artifacts import ArtifactError, ArtifactMismatch, NodeCache
from harness.engines import get_engine

# The tail of stderr kept with a failed run: enough for the engine's one-line error and context.
STDERR_KEEP = 4000


@dataclass(frozen=True)
class RunJob:
    """Everything a board needs for one run; picklable. Artifacts are named by sha256; the
    paths are the coordinator's until ``localise`` points them into a node's cache."""

    run_key: str
    label: str  # for progress lines and errors
    command: str  # generate | ppl | attn-bench
    binary: str  # a path where the job runs (the driver's, or a node cache's)
    binary_sha256: str  # what the run planned: a push of anything else is refused
    model_dir: str | None
    model_sha256: str | None  # the model tree's manifest hash (see devices.cache)
    ids: tuple[int, ...] | None  # prompt / text token ids (None for attn-bench)
    options: tuple[str, ...]  # engine flags after the file arguments
    timeout_s: float
    warmup: bool = False
    engine: str = "lmc"  # harness.engines name: how argv is made and stdout parsed
    model_file: bool = False  # the model is one file (a GGUF for llama-bench), not a folder
    # gbm's tree file, an artifact like the binary: pushed by hash, its device path appended to
    # the options as --predictor
    predictor: str | None = None
    predictor_sha256: str | None = None


@dataclass
class RunReport:
    run_key: str
    device: str
    status: str  # ok | failed | lost | busy (the board's lock file was taken; nothing ran)
    started_at: datetime
    finished_at: datetime
    wall_ms: float  # the whole run as the actor saw it: pushes, fingerprints, engine
    exit_code: int | None = None
    engine_ms: float | None = None  # the engine process alone
    stdout: str = ""
    error: str | None = None
    engine_json: Any = None  # the engine's parsed stdout (lmc: a dict; llama-bench: a list)
    snapshots: dict[str, dict[str, Any]] = field(default_factory=dict)  # phase -> fingerprint


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


def localise(job: RunJob, cache: NodeCache) -> RunJob:
    """The job with its artifacts materialised (by hash) in this node's cache."""
    binary = cache.blob(job.binary_sha256, f"engine binary {Path(job.binary).name}")
    model = None
    if job.model_sha256 is not None and job.model_dir is not None:
        name = f"model {Path(job.model_dir).name}"
        model = str(cache.blob(job.model_sha256, name) if job.model_file
                    else cache.tree(job.model_sha256, name))
    predictor = job.predictor
    if job.predictor is not None and job.predictor_sha256 is not None:
        predictor = str(cache.blob(job.predictor_sha256,
                                   f"predictor {Path(job.predictor).name}"))
    return replace(job, binary=str(binary), model_dir=model, predictor=predictor)


def ids_file(ids: tuple[int, ...], folder: Path) -> Path:
    """The ids as a whitespace-separated file named by its content (written once per actor)."""
    text = " ".join(map(str, ids)) + "\n"
    path = folder / f"ids-{hashlib.sha256(text.encode()).hexdigest()[:24]}.txt"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # actors may write the same file
        tmp.write_text(text)
        tmp.replace(path)
    return path


def execute(job: RunJob, device_name: str, pushes: PushMemo, scratch: Path) -> RunReport:
    """Run ``job`` on the device of ``pushes.transport``, between two fingerprints.

    The fingerprints and the engine go in one remote command (``probed_run``), whose engine
    wall time is taken on the device. Warm-ups run the engine alone. A command that outlives
    its timeout is a failed run (the engine hung, the board answered); any other device error
    means the board was lost, and the run may be retried.
    """
    started = datetime.now(UTC)
    clock = time.perf_counter()
    report = RunReport(job.run_key, device_name, "lost", started, started, 0.0)
    transport = pushes.transport
    engine = get_engine(job.engine)
    try:
        model = None
        if job.model_dir is not None and job.model_sha256 is not None:
            # a model folder (lmc) or one file (a GGUF for llama-bench)
            model = pushes.push(Path(job.model_dir), job.model_sha256, tree=not job.model_file)
        # the token ids travel as the command's standard input: a prompt is small and often
        # new, and pushing it into the device cache would cost round trips of its own
        ids = ids_file(job.ids, scratch) if job.ids is not None else None
        binary = pushes.push(Path(job.binary), job.binary_sha256)
        options = job.options
        if job.predictor is not None and job.predictor_sha256 is not None:
            options += ("--predictor", pushes.push(Path(job.predictor), job.predictor_sha256))
        argv = engine.argv(job.command, binary, model, ids is not None, options)
        if job.warmup:
            device = transport.device
            result = transport.run_host(locked(device_argv(device, argv, None)),
                                        timeout=job.timeout_s, stdin_file=ids)
            check_locked(device.name, device.workdir, result)
        else:
            probed = probed_run(transport, argv, timeout=job.timeout_s, stdin_file=ids,
                                lock=True, cache=pushes.cache)
            result = probed.result
            report.snapshots = {"before": probed.before, "after": probed.after}
    except (CommandTimeout, ArtifactError) as exc:
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
    report.stdout = engine_output.kept_stdout(result.stdout)  # all of it once accepted
    if result.exit_code != 0:
        report.status = "failed"
        report.error = (result.stderr or "").strip()[-STDERR_KEEP:] or \
            f"{job.engine} exited with code {result.exit_code} and printed nothing on stderr"
        return _finish(report, clock)
    # checked here, on the device side: the driver only ever sees a valid document
    trace = engine_output.trace_path(job.options)
    try:
        report.engine_json = engine.parse(result.stdout, job.command)
        if trace is not None and not job.warmup:
            report.engine_json[engine_output.TRACE_KEY] = engine_output.fetch_trace(transport,
                                                                                    trace)
    except engine_output.EngineOutputError as exc:
        report.status, report.error = "failed", str(exc)
        return _finish(report, clock)
    except ValueError as exc:  # json.JSONDecodeError is one
        report.status = "failed"
        report.error = f"{job.engine} printed no valid output ({exc}): {result.stdout[:200]!r}"
        return _finish(report, clock)
    report.status, report.stdout = "ok", result.stdout
    return _finish(report, clock)


def _finish(report: RunReport, clock: float) -> RunReport:
    report.finished_at = datetime.now(UTC)
    report.wall_ms = round((time.perf_counter() - clock) * 1000.0, 3)
    return report


def scratch_dir() -> Path:
    path = Path(tempfile.gettempdir()) / "benchfarm-scratch"
    path.mkdir(exist_ok=True)
    return path
