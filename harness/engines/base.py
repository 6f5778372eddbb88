"""What every engine adapter provides, and the records they all share.

An engine (``lmc``, ``llama-bench`` ...) is one adapter object, in its own package under
``harness/engines/``: its spec section (validated into frozen config records), which workload
kinds it runs and the configs it crosses them with, how to build it and make its model
artifact, the work order of one run, the argv on a device, the check of its stdout, the common
:class:`Figures` (``db.records``: the store and the reports read their list too) and the stored
:class:`Outcome` of its output, and a health command.
Planning, expansion, the runner and the results mapping talk to engines only through this
interface (``harness.engines.adapter_of``): none of them names an engine.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from db.records import Figures, Outcome
from devices.checker import Checker
from devices.isa import IsaError, IsaLevel, split_target
from devices.transport import Transport
from harness.contract import WorkOrder
from harness.errors import InputError
from harness.identity import Catalogue
from harness.workloads.base import Material, WorkloadKind
from harness.workloads.kinds import WorkloadPoint


class Spec(Protocol):
    """What the adapters read of a spec (harness.spec.Spec, which is read with the engines'
    sections, so the engines do not import it)."""

    path: Path
    model: Path | None
    revisions: list[str]


@dataclass
class BuildRecord:
    """One engine binary: how it was built and what it is (its sha256 names it)."""

    target: str
    variant: str
    toolchain: str
    compiler: str
    compiler_version: str
    cflags: list[str]
    ldflags: list[str]
    source_hash: str
    revision: str
    build_key: str
    binary: str
    binary_sha256: str
    build_seconds: float
    rebuilt: bool
    extra: dict = field(default_factory=dict)
    engine: str = ""  # the adapter the binary belongs to
    isa: str = ""  # the instruction-set level it was built for (devices.isa); its boards have it

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


class NeedsBuild(InputError):
    """An engine whose runs cannot be named (their run keys) without building it."""

    def __init__(self, engine: str, message: str) -> None:
        super().__init__(message)
        self.engine = engine


def host_arch() -> str:
    return os.uname().machine


def parse_target(target: str | None) -> tuple[str, IsaLevel]:
    """(arch, instruction-set level) of a build target, ``arch`` or ``arch:level`` (default:
    this machine's arch at the highest level it runs); InputError naming the choices."""
    try:
        return split_target(target or host_arch())
    except IsaError as exc:
        raise InputError(str(exc)) from None


@contextlib.contextmanager
def build_lock(build_dir: Path) -> Iterator[None]:
    """Several processes (test sessions, Ray workers) may build the same key at once: one
    builds, the others wait here and then find the finished binary."""
    with open(build_dir / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# builds every (revision, target) of an engine: (engine name, targets) -> records
BuildFn = Callable[[str, list[tuple[str, str]]], dict[tuple[str, str], BuildRecord]]


@dataclass(frozen=True)
class Artifact:
    """A model as an engine consumes it: a directory (pushed as a tree) or one file."""

    path: Path
    sha256: str  # identity in run keys and the models table
    info: dict[str, Any]  # stored with the model row (config.json, GGUF type ...)


@dataclass
class Prepared:
    """What an engine prepared for a plan (``EngineAdapter.prepare``; ``identities`` names the
    same without building): what its runs use that must exist before they can be named. Its
    builds by (revision, target), its models (sha256 -> path and info, for the models table),
    the artifacts besides the binaries that the driver serves (the planner adds the binaries),
    and what the adapter itself needs to make its work orders (not the workload's ``Material``,
    which the kind makes per workload point)."""

    builds: dict[tuple[str, str], BuildRecord]
    models: dict[str, tuple[Path, dict[str, Any]]] = field(default_factory=dict)
    catalogue: Catalogue = field(default_factory=Catalogue.empty)
    inputs: Any = None  # the adapter's own (lmc: the model's identity and gbm's trees)


@dataclass
class PlannedWork:
    """One cell made into a run by its engine (the planner names it by its run key)."""

    order: WorkOrder  # run_key empty until the planner sets it
    key_model: str | None  # the model's identity in the run key
    model_sha: str | None  # the model (or GGUF) the run reads; None when it reads none
    stored: dict[str, Any] = field(default_factory=dict)  # added to the stored config


@dataclass(frozen=True)
class StoredRun:
    """A stored ok run, as `benchfarm reproduce` hands it to its engine's adapter: the run row
    (its config holds the flags it ran with), its outcome, and what the harness verified (the
    identical binary, the model, the prompt ids)."""

    row: dict[str, Any]
    outcome: dict[str, Any] | None
    binary: Path
    binary_sha256: str
    model_dir: str | None
    ids: tuple[int, ...] | None


@dataclass
class Rerun:
    """A stored run made into a work order again (``EngineAdapter.rerun``), and how its result is
    compared with the original: the outputs (``same``: identical or not, and where they part),
    and one timing (``timing``: its value in the new run's report)."""

    order: WorkOrder
    metric: str  # the timing compared
    original: float | None  # its stored value
    same: Callable[[dict[str, Any]], tuple[bool | None, str]]  # engine document -> (same, where)
    timing: Callable[[dict[str, Any], float | None], float | None]  # (document, engine_ms)


class EngineAdapter(Protocol):
    """One engine behind the harness: the adapter the harness reaches it through."""

    name: str
    section: str  # the spec's table of its axes
    # the folders of this repository its builds come from: a spec's revisions are commits of
    # it, and history, bisect and track follow the commits that change them (() for an engine
    # built from a source of its own)
    source_paths: tuple[str, ...]
    # which of its config keys are stored as the runs' axis columns (db.records.AXIS_COLUMNS),
    # and of those, the ones a run's duration depends on (`run --dry-run`'s estimate)
    axis_columns: tuple[str, ...]
    timing_columns: tuple[str, ...]
    reproducible: bool  # `benchfarm reproduce` can rerun its stored runs (``rerun``)

    def default_revisions(self) -> list[str]:
        """A spec's ``revisions`` when it names none (and this is its first engine)."""
        ...

    def parse_section(self, check: Checker, value: Any, spec_dir: Path,
                      kinds: list[str]) -> Any:
        """Its spec section (``{}`` when absent) as its axes record; errors name the key."""
        ...

    def runs_kind(self, kind: WorkloadKind) -> bool:
        """Whether it runs workloads of this kind."""
        ...

    def revisions(self, spec: Spec) -> list[str]:
        """The revisions its cells cross (lmc: the spec's; others: their own source's)."""
        ...

    def threads_key(self, axes: Any) -> str | None:
        """The spec key that fixes its threads when a class's boards differ in ``threads``
        (None: it needs none)."""
        ...

    def configs(self, axes: Any, kind: WorkloadKind, default_threads: int) -> list[Any]:
        """Its config records for one workload kind; each has ``as_dict()`` (run keys) and
        ``columns()`` (the store's axis columns)."""
        ...

    def count_configs(self, axes: Any, kind: WorkloadKind, default_threads: int) -> int:
        """len(configs(...)), counted without building them."""
        ...

    def prepare(self, spec: Spec, axes: Any, archs: list[str], build: BuildFn) -> Prepared:
        """Build what its runs use for ``archs`` (cached: instant once built); writes under
        build/ only."""
        ...

    def identities(self, spec: Spec, axes: Any, archs: list[str]) -> Prepared:
        """What ``prepare`` would return, with nothing built or written: enough to name the
        runs (their keys), not to execute them; NeedsBuild when that is impossible."""
        ...

    def work(self, point: WorkloadPoint, config: Any, record: BuildRecord, prepared: Prepared,
             material: Material, timeout_s: float) -> PlannedWork:
        """The work order of one cell: a workload point, one of its configs, its build."""
        ...

    def build(self, target: str, revision: str | None) -> BuildRecord:
        """Build (or find cached) the engine binary for ``target``."""
        ...

    def argv(self, command: str, binary: str, model: str | None, stdin_ids: bool,
             options: Sequence[str]) -> list[str]:
        """The command line on the device; paths are the device's (pushed) paths."""
        ...

    def parse(self, stdout: str, command: str) -> Any:
        """The engine's stdout of ``command`` as data; raises ValueError (OutputRefused with
        its reason) when it is not the engine's output: board output is untrusted."""
        ...

    def collect(self, transport: Transport, order: WorkOrder, data: Any) -> None:
        """After a run that printed valid output: fetch what it left on the board into
        ``data`` (lmc: the selection trace)."""
        ...

    def figures(self, command: str, data: Any) -> Figures:
        """The common figures of one parsed output."""
        ...

    def outcome(self, command: str, data: Any, figures: Figures) -> Outcome:
        """What the run produced, for the store (the workload kind scores it afterwards)."""
        ...

    def rebuild(self, build: dict[str, Any]) -> BuildRecord:
        """The stored build row's binary made again from its recorded revision, variant and
        toolchain (`reproduce`, when the recorded file is gone)."""
        ...

    def rerun(self, stored: StoredRun, timeout_s: float) -> Rerun:
        """The work order that runs a stored run again exactly, and how to compare the result;
        InputError when the stored run lacks what that needs."""
        ...

    def health_argv(self, binary: str) -> list[str]:
        """A quick command that proves the binary runs on a device."""
        ...

    def health_verdict(self, stdout: str, stderr: str, arch: str) -> tuple[bool, str]:
        """Whether the health command's output (it exited 0) shows a working engine on a
        device of ``arch``, and a line that says what it showed."""
        ...

    def resident_weights(self, spec: Spec, axes: Any) -> dict[str, int]:
        """The bytes of the spec model's weights it keeps resident, by the weight format of
        its configs (harness.plan.fit refuses a board with less memory); {} when not known."""
        ...
