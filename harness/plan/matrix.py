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
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from harness.engines.llamabench import NAME as LLAMA_BENCH
from harness.engines.llamabench import LlamaBenchConfig
from harness.errors import InputError
from harness.spec import Spec
from harness.spec_engine import EVICTING, SWITCHES
from harness.spec_workloads import WorkloadAxes

# The most runs one matrix may have unless --max-runs allows more: planning keeps every run in
# memory and writes its workload rows first, so an accidental 10^7-run spec is refused at once.
MAX_RUNS = 20000
# Engine subcommand per workload kind.
COMMANDS = {"needle": "generate", "decode": "generate", "ppl": "ppl", "attn-bench": "attn-bench"}


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

    @property
    def key(self) -> str:
        """The placement's identity in run keys and queues."""
        return f"class:{self.selector}" if self.by_class else self.selector


@dataclass(frozen=True)
class EngineConfig:
    policy: str
    k: int | None
    block: int | None
    probes: int | None
    kv: str | None  # None where the command ignores it (attn-bench)
    wq: str | None
    threads: int
    prefill_attn: str | None
    measure_selection: bool
    # engine switches (harness.spec_engine.SWITCHES); None: the engine's default
    importance: bool | None = None
    recency: bool | None = None
    probe_summary: bool | None = None
    ref_attn: bool | None = None
    trace_selection: bool | None = None  # --trace-selection (None: no trace)
    kv_budget: int | None = None  # --kv-budget: positions each head keeps (None: no eviction)
    predictor: str | None = None  # gbm: the sha256 of its tree file (harness.spec_engine.Predictor)
    measure_keys: int | None = None  # --measure-keys: rank the keys of every N-th query

    def as_dict(self) -> dict[str, Any]:
        """The config for run keys and records; switches at their default (and the axes added
        later, when unset) are left out, so a run keeps the key it had before they existed."""
        optional = (*SWITCHES, "trace_selection", "kv_budget", "predictor", "measure_keys")
        return {name: value for name, value in asdict(self).items()
                if value is not None or name not in optional}


@dataclass(frozen=True)
class WorkloadPoint:
    """One point of a workload's axes, with its scalar settings (max_new, runs ...)."""

    kind: str
    params: tuple[tuple[str, Any], ...]  # sorted by name

    def get(self, name: str) -> Any:
        return dict(self.params)[name]

    @property
    def command(self) -> str:
        return COMMANDS[self.kind]

    def label(self) -> str:
        """For progress lines: a filler or text file by its name (the full path is in the stored
        parameters), a needle template as "own"."""
        shown = {k: Path(v).name if k in ("filler", "text")
                 else "own" if k in ("needle", "question") else v for k, v in self.params}
        return self.kind + " " + " ".join(f"{k}={v}" for k, v in shown.items())


@dataclass(frozen=True)
class Cell:
    workload: WorkloadPoint
    config: EngineConfig | LlamaBenchConfig  # the config record of the cell's engine
    revision: str
    placement: Placement
    repeat: int
    engine: str = "lmc"  # harness.engines name


def resolve_placements(spec: Spec, devices: Sequence[DeviceLike],
                       selectors: Sequence[str] | None = None) -> list[Placement]:
    """Map the spec's `devices` (or the --devices override) onto the inventory.

    A device name pins runs to that board; a class name makes a pool of all boards of the class.
    """
    by_name = {d.name: d for d in devices}
    classes: dict[str, list[DeviceLike]] = {}
    for device in devices:
        classes.setdefault(device.cls, []).append(device)
    where = "--devices" if selectors else f"{spec.path}: key 'devices'"
    placements = []
    for selector in selectors or spec.devices:
        if selector in by_name:
            device = by_name[selector]
            placements.append(Placement(selector, False, device.arch, device.engine_threads,
                                        (device.name,)))
        elif selector in classes:
            members = classes[selector]
            archs = {d.arch for d in members}
            if len(archs) > 1:
                raise InputError(f"{where}: class {selector!r} mixes architectures "
                                 f"{sorted(archs)}; name the devices instead")
            threads = {d.engine_threads for d in members}
            if len(threads) > 1 and spec.engine.threads is None:
                raise InputError(f"{where}: the boards of class {selector!r} differ in `threads` "
                                 f"{sorted(threads)}; set engine.threads in the spec")
            placements.append(Placement(selector, True, members[0].arch, min(threads),
                                        tuple(d.name for d in members)))
        else:
            raise InputError(
                f"{where}: {selector!r} is neither a device nor a class of the inventory; "
                f"devices: {', '.join(sorted(by_name))}; classes: {', '.join(sorted(classes))}")
    if len({p.key for p in placements}) != len(placements):
        raise InputError(f"{where}: a device or class is listed twice")
    return placements


def _workload_points(workload: WorkloadAxes) -> list[WorkloadPoint]:
    names = sorted(workload.axes)
    points = []
    for values in itertools.product(*(workload.axes[n] for n in names)):
        params = dict(zip(names, values, strict=True)) | workload.settings
        points.append(WorkloadPoint(workload.kind, tuple(sorted(params.items()))))
    return points


def _engine_configs(spec: Spec, kind: str, default_threads: int) -> list[EngineConfig]:
    engine = spec.engine
    # attn-bench has no model: no weight format and no prefill; ppl measures no selection.
    uses_model = kind != "attn-bench"
    measures = COMMANDS[kind] in ("generate", "attn-bench")
    configs: list[EngineConfig] = []
    for policy in engine.policies:
        names = sorted(policy.switches)
        for k, block, probes, budget, kv, wq, threads, prefill, *switches in itertools.product(
            policy.k, policy.block, policy.probes, policy.kv_budget, engine.kv, engine.wq,
            engine.threads or [default_threads], engine.prefill_attn,
            *(policy.switches[name] for name in names),
        ):
            config = EngineConfig(
                policy=policy.name, k=k, block=block, probes=probes,
                kv=kv,
                wq=wq if uses_model else None,
                threads=threads,
                prefill_attn=prefill if uses_model else None,
                measure_selection=engine.measure_selection and measures,
                trace_selection=True if engine.trace_selection and measures else None,
                kv_budget=budget if uses_model else None,
                predictor=policy.predictor.sha256 if policy.predictor else None,
                measure_keys=engine.measure_keys
                if kind == "ppl" and policy.name in EVICTING else None,
                **dict(zip(names, switches, strict=True)),
            )
            if config not in configs:  # axes a command ignores would only repeat a config
                configs.append(config)
    return configs


def expand(spec: Spec, placements: Sequence[Placement]) -> list[Cell]:
    """All cells of the matrix, in a fixed order (revision, placement, workload, config, repeat).

    Policy-specific axes are crossed with their own policy only (see harness.spec_engine). lmc's
    cells cross the spec's revisions; llama-bench's (decode workloads only) are built from its own
    source, once per placement.
    """
    cells = []
    if "lmc" in spec.engines:
        for revision in spec.revisions:
            for placement in placements:
                for workload in spec.workloads:
                    configs = _engine_configs(spec, workload.kind, placement.threads)
                    for point in _workload_points(workload):
                        for config in configs:
                            for repeat in range(spec.repeats):
                                cells.append(Cell(point, config, revision, placement, repeat))
    if spec.llama_bench is not None:
        for placement in placements:
            configs = spec.llama_bench.configs(placement.threads)
            for workload in (w for w in spec.workloads if w.kind == "decode"):
                for point in _workload_points(workload):
                    for config in configs:
                        for repeat in range(spec.repeats):
                            cells.append(Cell(point, config, LLAMA_BENCH, placement, repeat,
                                              engine=LLAMA_BENCH))
    return cells


def _config_count(spec: Spec, kind: str) -> int:
    """len(_engine_configs(spec, kind, ...)) without building them: axis values are distinct,
    and only the axes a command ignores collapse."""
    engine = spec.engine
    uses_model = kind != "attn-bench"
    shared = (len(engine.kv) * len(engine.threads or [0])
              * (len(engine.wq) * len(engine.prefill_attn) if uses_model else 1))
    return shared * sum(len(p.k) * len(p.block) * len(p.probes)
                        * (len(p.kv_budget) if uses_model else 1)
                        * math.prod(len(values) for values in p.switches.values())
                        for p in engine.policies)


def count_cells(spec: Spec, placements: Sequence[Placement]) -> dict[str, int]:
    """len(expand(spec, placements)) per placement key, counted without expanding, so that a
    matrix too large to plan is refused at once."""
    def points(w: Any) -> int:
        return math.prod(len(values) for values in w.axes.values())

    lmc = 0
    if "lmc" in spec.engines:
        lmc = len(spec.revisions) * sum(points(w) * _config_count(spec, w.kind)
                                        for w in spec.workloads)
    decode_points = sum(points(w) for w in spec.workloads if w.kind == "decode")
    counts = {}
    for p in placements:
        llama = 0 if spec.llama_bench is None else \
            decode_points * len(spec.llama_bench.configs(p.threads))
        counts[p.key] = (lmc + llama) * spec.repeats
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

    ``build`` holds the engine build's identity (source hash, target, compiler version, flags);
    the revision name itself is left out: two revisions with the same sources are the same engine.
    """
    material = {
        "build": {k: build[k] for k in ("source_hash", "target", "compiler_version", "cflags",
                                        "ldflags")},
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
