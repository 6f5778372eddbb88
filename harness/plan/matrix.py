"""Expansion of a spec into the cells of its matrix, run keys, and the interleaved run order.

Expansion is deterministic: the same spec and inventory give the same cells in the same order.
A cell becomes a run once its engine build, model and workload are known; its run key hashes
exactly those identities plus the engine config, the placement and the repeat index, so a run is
recognised across coordinator restarts and only redone when something that matters changed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from devices import isa
from devices.inventory import Device
from harness.engines import ENGINES
from harness.errors import InputError
from harness.spec import Spec
from harness.spec.workloads import WorkloadAxes
from harness.workloads.kinds import KINDS, WorkloadPoint


class DeviceLike(Protocol):
    name: str
    arch: str
    cls: str

    @property
    def engine_threads(self) -> int: ...


@dataclass(frozen=True)
class Placement:
    """Where runs go: one named device, or any board of a device class (a pool)."""

    selector: str  # the device name or class name as written in the spec
    by_class: bool
    arch: str
    threads: int  # the engine threads when the spec does not set them
    devices: tuple[str, ...]  # the boards that may take the runs
    isa: str = ""  # the instruction-set level its boards run (devices.isa); "" = the arch's own

    @property
    def key(self) -> str:
        """The placement's identity in run keys and queues."""
        return f"class:{self.selector}" if self.by_class else self.selector

    @property
    def build_target(self) -> str:
        """What its engines are built for: ``arch:level`` (harness.engines.base.split_target)."""
        return f"{self.arch}:{self.isa}" if self.isa else self.arch


@dataclass(frozen=True)
class Cell:
    workload: WorkloadPoint
    config: Any  # the config record of the cell's engine (its as_dict() goes into run keys)
    revision: str
    placement: Placement
    repeat: int
    engine: str  # harness.engines name


def resolve_placements(spec: Spec, devices: Sequence[DeviceLike],
                       selectors: Sequence[str] | None = None,
                       recorded: Mapping[str, Mapping[str, Any]] | None = None
                       ) -> list[Placement]:
    """Map the spec's `devices` (or the --devices override) onto the inventory.

    A device name pins runs to that board; a class name makes a pool of all boards of the class.
    Each placement's instruction-set level comes from ``pool_level``; ``recorded``: what the
    boards' newest fingerprints recorded (db.boards.Boards.newest_facts).
    """
    recorded = recorded or {}
    by_name = {d.name: d for d in devices}
    classes: dict[str, list[DeviceLike]] = {}
    for device in devices:
        classes.setdefault(device.cls, []).append(device)
    where = "--devices" if selectors else f"{spec.path}: key 'devices'"
    placements = []
    for selector in selectors or spec.devices:
        if selector in by_name:
            device = by_name[selector]
            level = pool_level([device], spec, where, recorded)
            placements.append(Placement(selector, False, device.arch, device.engine_threads,
                                        (device.name,), level))
        elif selector in classes:
            members = classes[selector]
            archs = {d.arch for d in members}
            if len(archs) > 1:
                raise InputError(f"{where}: class {selector!r} mixes architectures "
                                 f"{sorted(archs)}; name the devices instead")
            threads = {d.engine_threads for d in members}
            unfixed = [key for name in spec.engines
                       if (key := ENGINES[name].threads_key(spec.axes(name))) is not None]
            if len(threads) > 1 and unfixed:
                raise InputError(f"{where}: the boards of class {selector!r} differ in `threads` "
                                 f"{sorted(threads)}; set {unfixed[0]} in the spec")
            placements.append(Placement(selector, True, members[0].arch, min(threads),
                                        tuple(d.name for d in members),
                                        pool_level(members, spec, where, recorded)))
        else:
            raise InputError(
                f"{where}: {selector!r} is neither a device nor a class of the inventory; "
                f"devices: {', '.join(sorted(by_name))}; classes: {', '.join(sorted(classes))}")
    if len({p.key for p in placements}) != len(placements):
        raise InputError(f"{where}: a device or class is listed twice")
    return placements


def known_features(board: DeviceLike,
                   recorded: Mapping[str, Mapping[str, Any]]) -> frozenset[str] | None:
    """A board's CPU features as far as they are known without reaching it: an emulated
    board's from its emulator's CPU model, this machine's own, or what the board's newest
    fingerprint recorded (``recorded``: its facts by name); None when nothing is known (never
    fingerprinted, or a placeholder board)."""
    if isinstance(board, Device):
        model = isa.emulated_model(board.exec_prefix) if board.emulated else None
        if model in isa.QEMU_MODELS:
            return isa.QEMU_MODELS[model]
        if board.is_local:
            return isa.host_features()
    features = recorded.get(board.name, {}).get("cpu_features")
    return frozenset(features) if features else None


def pool_level(boards: Sequence[DeviceLike], spec: Spec, where: str,
               recorded: Mapping[str, Mapping[str, Any]]) -> str:
    """The instruction-set level a placement's boards run: the spec's pin for their arch, else
    the inventory's, else the highest level every one of them supports (``known_features``).
    InputError naming the board and the features it lacks when a pinned level is more than a
    board has. A board whose features are not known yet gets the pin or the level every build
    had before there were levels (the runner still checks the board before it starts a
    binary, and the board's first fingerprint records its features for the next plan)."""
    arch = boards[0].arch
    levels = []
    for board in boards:
        features = known_features(board, recorded)
        pinned = spec.isa.get(arch) or getattr(board, "isa", None)
        if features is None:
            levels.append(isa.level(pinned or isa.FALLBACK[arch], arch))
            continue
        if pinned is None:
            levels.append(isa.highest(arch, features))
            continue
        lacking = isa.missing(isa.level(pinned, arch), features)
        if lacking:
            source = f"{spec.path}: key 'isa'" if spec.isa.get(arch) else \
                f"the inventory's isa for {board.name!r}"
            raise InputError(f"{where}: board {board.name!r} cannot run instruction-set level "
                             f"{pinned!r} ({source}): its CPU lacks {', '.join(lacking)}")
        levels.append(isa.level(pinned, arch))
    order = [lv.name for lv in isa.LEVELS[arch]]
    return min((lv.name for lv in levels), key=order.index)


def archs_of(placements: Sequence[Placement]) -> list[str]:
    """What the engines are built for: the placements' build targets (``arch:level``)."""
    return sorted({p.build_target for p in placements})


def _workload_points(workload: WorkloadAxes) -> list[WorkloadPoint]:
    names = sorted(workload.axes)
    points = []
    for values in itertools.product(*(workload.axes[n] for n in names)):
        params = dict(zip(names, values, strict=True)) | workload.settings
        points.append(WorkloadPoint(workload.kind, tuple(sorted(params.items()))))
    return points


def engines_of(spec: Spec) -> list[str]:
    """The spec's engines in the registry's order (the order of their cells)."""
    return [name for name in ENGINES if name in spec.engines]


def expand(spec: Spec, placements: Sequence[Placement]) -> list[Cell]:
    """All cells of the matrix, in a fixed order (engine, revision, placement, workload, config,
    repeat).

    Each engine crosses its own revisions (lmc: the spec's; llama-bench: its own source) and
    runs the workload kinds it can; its configs come from its own axes, policy-specific axes
    crossed with their own policy only (see harness.engines.lmc.section).
    """
    cells = []
    for name in engines_of(spec):
        adapter, axes = ENGINES[name], spec.axes(name)
        for revision in adapter.revisions(spec):
            for placement in placements:
                for workload in spec.workloads:
                    kind = KINDS[workload.kind]
                    if not adapter.runs_kind(kind):
                        continue
                    configs = adapter.configs(axes, kind, placement.threads)
                    for point in _workload_points(workload):
                        for config in configs:
                            for repeat in range(spec.repeats):
                                cells.append(Cell(point, config, revision, placement, repeat,
                                                  name))
    return cells


def count_cells(spec: Spec, placements: Sequence[Placement]) -> dict[str, int]:
    """len(expand(spec, placements)) per placement key, counted without expanding, so that a
    matrix too large to plan is refused at once."""
    def points(w: WorkloadAxes) -> int:
        return math.prod(len(values) for values in w.axes.values())

    counts = {}
    for p in placements:
        total = 0
        for name in engines_of(spec):
            adapter, axes = ENGINES[name], spec.axes(name)
            total += len(adapter.revisions(spec)) * sum(
                points(w) * adapter.count_configs(axes, KINDS[w.kind], p.threads)
                for w in spec.workloads if adapter.runs_kind(KINDS[w.kind]))
        counts[p.key] = total * spec.repeats
    return counts


def check_size(spec: Spec, placements: Sequence[Placement], max_runs: int) -> int:
    """The matrix's number of runs; InputError when it is above ``max_runs``."""
    total = sum(count_cells(spec, placements).values())
    if total > max_runs:
        raise InputError(f"{spec.path}: the matrix has {total} runs, more than the limit of "
                         f"{max_runs}; cut its axes, or raise the limit with --max-runs "
                         "(`benchfarm run --dry-run` shows the size and an estimated time)")
    return total


def run_key(build: dict[str, Any], model_sha256: str | None, workload_hash: str,
            cell: Cell) -> str:
    """sha256 of everything that identifies a run.

    ``build`` holds the engine build's identity (source hash, target, instruction-set level,
    compiler version, flags); the revision name itself is left out: two revisions with the same
    sources are the same engine.
    """
    material = {
        "build": {k: build.get(k, "") for k in ("source_hash", "target", "isa",
                                                "compiler_version", "cflags", "ldflags")},
        "model": model_sha256,
        "workload": workload_hash,
        "workload_params": [list(p) for p in cell.workload.params],
        "config": cell.config.as_dict(),
        "device": cell.placement.key,
        "repeat": cell.repeat,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


T = TypeVar("T")


def interleave(items: Iterable[T], seed: int, round_of: Any = None) -> list[T]:
    """The run order: shuffled with a fixed seed so that drift on a board (heat, background load)
    spreads over all conditions instead of biasing the ones that happen to run late.

    With ``round_of`` (item -> round number, e.g. the repeat index) every round is shuffled on
    its own and rounds run in order, so an interrupted matrix has whole rounds done.
    """
    rng = random.Random(seed)
    rounds: dict[Any, list[T]] = {}
    for item in items:
        rounds.setdefault(round_of(item) if round_of else 0, []).append(item)
    ordered: list[T] = []
    for number in sorted(rounds):
        batch = rounds[number]
        rng.shuffle(batch)
        ordered.extend(batch)
    return ordered
