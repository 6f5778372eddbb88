"""From a validated spec and its placements to the runs of its matrix: builds, models,
workloads, run keys, work orders.

Planning is three steps, and only the last writes to the store:

- ``prepare`` makes what the runs use, engine by engine (each adapter's ``prepare``: its builds
  per (revision, target), its model artifacts such as llama-bench's GGUF files); it writes
  under build/, never the store. ``identities`` gives the same records without building
  anything, for judging stored runs (``audit --stored-only``).
- ``make_plan`` names every run of the matrix on the driver from those: every workload made
  by its kind (its ids hashed), each run's key and work order (by its engine's adapter). It
  builds nothing and writes nothing.
- ``register_plan`` stores the reference rows (experiment, builds, models, workloads, devices),
  gives each run its row ids, and leaves out the runs already stored as ok unless ``force``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from db.store import Store
from devices import isa
from devices.inventory import Device
from harness.contract import WorkOrder
from harness.engines import ENGINES, adapter_of
from harness.engines.base import BuildFn, BuildRecord, Prepared
from harness.identity import Catalogue
from harness.plan.matrix import (
    Cell,
    Placement,
    archs_of,
    engines_of,
    expand,
    interleave,
    run_key,
)
from harness.spec import Spec
from harness.workloads.base import Material
from harness.workloads.kinds import WorkloadPoint


@dataclass
class PlannedRun:
    key: str
    cell: Cell
    order: WorkOrder
    group: str  # warm-up group: (build, model); a board warms up once per group
    model_sha: str | None  # the model (or GGUF) the run reads, None when it reads none
    answer: str | None
    stored: dict[str, Any] = field(default_factory=dict)  # what its engine adds to its config
    # the rows it refers to: 0 / None until register_plan stored them
    experiment_id: int = 0
    build_id: int = 0
    model_id: int | None = None
    workload_id: int = 0
    attempts: int = 0  # tries so far (board losses)
    measurement_id: int | None = None  # its attempt recorded in the store and not yet complete
    not_before: float = 0.0  # monotonic time before which it is not retried
    lost_on: set[str] = field(default_factory=set)  # boards it was lost on (pools avoid them)

    @property
    def placement(self) -> Placement:
        return self.cell.placement


@dataclass
class Plan:
    spec: Spec
    placements: list[Placement]
    boards: dict[str, Device]  # every board a placement may use
    builds: dict[tuple[str, str], BuildRecord]  # (revision, target) -> build
    models: dict[str, tuple[Path, dict[str, Any]]]  # sha256 -> (path, info) of each model
    workloads: dict[WorkloadPoint, Material]
    runs: list[PlannedRun]  # the whole matrix, in run order
    catalogue: Catalogue  # the artifacts the runs name, by sha256, where the driver has them
    # set by register_plan:
    experiment_id: int = 0
    device_ids: dict[str, int] = field(default_factory=dict)
    todo: list[PlannedRun] = field(default_factory=list)  # the runs to execute now
    force: bool = False  # redo runs stored as ok

    @property
    def skipped(self) -> int:
        return len(self.runs) - len(self.todo)


def prepare(spec: Spec, placements: Sequence[Placement], build: BuildFn) -> dict[str, Prepared]:
    """Build every engine the spec runs for the placements' architectures (cached: instant once
    built) and make their model artifacts. Writes under build/ only."""
    archs = archs_of(placements)
    return {name: ENGINES[name].prepare(spec, spec.axes(name), archs, build)
            for name in engines_of(spec)}


def identities(spec: Spec, placements: Sequence[Placement]) -> dict[str, Prepared]:
    """What ``prepare`` would return, with nothing built or written: enough to name the runs
    (their keys), not to execute them. InputError for an engine whose identity needs its
    build (llama-bench)."""
    archs = archs_of(placements)
    return {name: ENGINES[name].identities(spec, spec.axes(name), archs)
            for name in engines_of(spec)}


def make_plan(spec: Spec, placements: Sequence[Placement], devices: Mapping[str, Device],
              prepared: Mapping[str, Prepared]) -> Plan:
    """Every run of the matrix, named: keys, work orders, warm-up groups. Builds nothing and
    writes nothing; ``register_plan`` stores it. ``devices``: the inventory's, by name."""
    boards = {name: devices[name] for p in placements for name in p.devices}
    catalogue = Catalogue.empty()
    builds: dict[tuple[str, str], BuildRecord] = {}
    models: dict[str, tuple[Path, dict[str, Any]]] = {}
    for engine_prepared in prepared.values():
        catalogue.merge(engine_prepared.catalogue)
        builds |= engine_prepared.builds
        models |= engine_prepared.models
    for record in builds.values():  # every engine binary, served by its hash
        catalogue.add_file(Path(record.binary), record.binary_sha256)

    made: dict[WorkloadPoint, Material] = {}
    runs = []
    for cell in expand(spec, placements):
        material = made.get(cell.workload)
        if material is None:
            point = cell.workload
            material = made[point] = point.workload_kind.material(spec.model, point.identity())
        engine_prepared = prepared[cell.engine]
        record = engine_prepared.builds[(cell.revision, cell.placement.build_target)]
        work = adapter_of(cell.engine).work(cell.workload, cell.config, record,
                                            engine_prepared, material, spec.timeout_s)
        key = run_key(asdict(record), work.key_model, material.hash, cell)
        needs = tuple(sorted(isa.BY_NAME[record.isa].features)) if record.isa else ()
        runs.append(PlannedRun(
            key=key, cell=cell, order=replace(work.order, run_key=key, isa_features=needs),
            group=f"{record.binary_sha256}/{work.model_sha or '-'}",
            model_sha=work.model_sha, answer=material.answer, stored=work.stored,
        ))
    # Two revisions with identical engine sources give identical keys: run such a cell once.
    runs = list({r.key: r for r in reversed(runs)}.values())[::-1]
    runs = interleave(runs, spec.order_seed, round_of=lambda r: r.cell.repeat)
    return Plan(spec, list(placements), boards, builds, models, made, runs, catalogue)


def register_plan(plan: Plan, store: Store, force: bool = False) -> Plan:
    """Store the plan's reference rows and give its runs their row ids; ``todo`` = the runs not
    yet stored as ok (all of them with ``force``)."""
    spec = plan.spec
    build_ids = {target: store.record_build(asdict(record))
                 for target, record in plan.builds.items()}
    model_ids = {sha: store.upsert_model(str(path), sha, info)
                 for sha, (path, info) in plan.models.items()}
    workload_ids = {point: store.upsert_workload(m.kind, m.params, m.hash, list(m.ids or []),
                                                 m.answer, m.needle_span)
                    for point, m in plan.workloads.items()}
    experiment_id = store.upsert_experiment(spec.name, spec.text, spec.hash)
    device_ids = {
        name: store.upsert_device(name, d.arch, d.cls, d.emulated,
                                  {"address": d.address, "cpus": d.cpus, "threads": d.threads,
                                   "exec_prefix": d.exec_prefix})
        for name, d in plan.boards.items()
    }
    for run in plan.runs:
        run.experiment_id = experiment_id
        run.build_id = build_ids[(run.cell.revision, run.placement.build_target)]
        run.model_id = None if run.model_sha is None else model_ids[run.model_sha]
        run.workload_id = workload_ids[run.cell.workload]
    done = set() if force else store.completed_run_keys([r.key for r in plan.runs])
    # run keys do not name the experiment: runs another experiment completed become this
    # one's too, so its summary, reports and audit tables include them
    store.link_runs(experiment_id, done)
    return replace(plan, experiment_id=experiment_id, device_ids=device_ids,
                   todo=[r for r in plan.runs if r.key not in done], force=force)
