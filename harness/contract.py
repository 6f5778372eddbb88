"""What crosses from the driver to a board and back: the work order, the report, who retries.

The driver (``harness.execution.scheduler``) hands one :class:`WorkOrder` at a time to a
board's runner actor (``harness.execution.runner.DeviceRunner.run``), which answers with one
:class:`RunReport`. Both are plain, picklable records: the actor may live on any node of a
Ray cluster. Artifacts travel by name (sha256), never by path: the paths in a work order are
the driver's until the actor points them into its node's cache.

The protocol, one exchange per run::

    driver                                         runner actor (the board's node)
    ------                                         -------------------------------
    WorkOrder  ───────── actor.run(order) ──────►  fetch artifacts by hash into the node
                                                   cache, push them into the board's cache,
                                                   fingerprint, run the engine under the
                                                   board's lock file, fingerprint, check
                                                   the engine's output with its adapter
    store the row  ◄──────── RunReport ──────────  status, timings, the checked document

A report's status says what happened and who acts on it:

=============  ======================  =======================================================
status         set by                  what the driver does
=============  ======================  =======================================================
``ok``         the runner              the engine exited 0 and its adapter accepted the
                                       output: the run is stored ``ok``; never run again
                                       unless ``--force``
``failed``     the runner              the engine exited non-zero, its output was refused,
                                       it outlived its timeout, or an artifact could not be
                                       provided or verified: stored ``failed`` with the
                                       reason; not retried in this session (a later
                                       ``benchfarm run`` tries it again)
``lost``       the runner, or the      the board could not be reached or dropped the
               driver when the actor   connection: the attempt is stored ``lost``; the run
               died                    goes back to its queue for a new runner (a pooled run
                                       may go to another board of its class), the board backs
                                       off ``backoff_s`` doubling per loss; after ``retries``
                                       more tries the last attempt is stored ``pending`` and
                                       after ``retries`` losses in a row the board is given up
                                       (its lost attempts stay ``lost``)
``busy``       the runner              the board's lock file is held by another coordinator
                                       (the lock file names it): nothing ran; the run waits
                                       for the board (no try is counted)
=============  ======================  =======================================================

The driver alone writes the store, one measurement per attempt (recorded ``running`` when it
is dispatched, so that a coordinator that dies leaves it to be found ``lost``). Besides the
reports it stores attempts that never came back:
``interrupted`` (Ctrl-C or SIGTERM while in flight), ``cancelled`` (``benchfarm cancel``),
``lost`` (the board's runner actor died with it, e.g. its node was lost, or its coordinator
vanished) and ``pending`` (no board left that can run it); a later ``benchfarm run`` finishes
those. When the driver stops, or loses a board's lease, the run in flight is killed on the
board first (``DeviceRunner.abort``).
Warm-up orders (``warmup = True``) run the engine alone and are never stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# The statuses a RunReport may carry (see the table above).
REPORT_STATUSES = ("ok", "failed", "lost", "busy")
# The tail of stderr kept with a failed run: enough for the engine's one-line error and context.
STDERR_KEEP = 4000
# How much of a refused stdout is stored with the failed run, to show what the board printed.
KEPT_STDOUT_CHARS = 64 * 1024


class OutputRefused(ValueError):
    """An engine adapter refused what a board printed; the message says why (the run fails
    with it as its error)."""


def kept_stdout(stdout: str) -> str:
    """What is stored of a stdout that was not accepted: its head."""
    return stdout[:KEPT_STDOUT_CHARS]


@dataclass(frozen=True)
class WorkOrder:
    """Everything a board needs for one run; picklable. Artifacts are named by sha256; the
    paths are the driver's until the runner points them into its node's cache."""

    run_key: str
    label: str  # for progress lines and errors
    engine: str  # the harness.engines adapter: how argv is made and stdout checked
    command: str  # the engine's command (lmc: generate | ppl | attn-bench)
    binary: str  # a path where the order runs (the driver's, or a node cache's)
    binary_sha256: str  # what the run planned: a push of anything else is refused
    model_dir: str | None
    model_sha256: str | None  # a model folder's manifest hash (devices.cache), or a file's
    ids: tuple[int, ...] | None  # prompt / text token ids, sent on the engine's stdin
    options: tuple[str, ...]  # engine flags after the file arguments
    timeout_s: float
    warmup: bool = False
    model_file: bool = False  # the model is one file (a GGUF for llama-bench), not a folder
    # a file a policy reads on the board (gbm's trees), an artifact like the binary: pushed by
    # hash, its device path appended to the options after ``extra_flag``
    extra_file: str | None = None
    extra_sha256: str | None = None
    extra_flag: str | None = None
    # the CPU features the binary's instruction-set level needs (devices.isa): checked against
    # the board's before the binary is started
    isa_features: tuple[str, ...] = ()


@dataclass
class RunReport:
    """What the runner says of one work order (its status: see the table above)."""

    run_key: str
    device: str
    status: str  # one of REPORT_STATUSES
    started_at: datetime
    finished_at: datetime
    wall_ms: float  # the whole run as the actor saw it: pushes, fingerprints, engine
    exit_code: int | None = None
    engine_ms: float | None = None  # the engine process alone
    stdout: str = ""
    error: str | None = None
    engine_json: Any = None  # the engine's checked output (lmc: a dict; llama-bench: a list)
    snapshots: dict[str, dict[str, Any]] = field(default_factory=dict)  # phase -> fingerprint
