"""From a validated spec to the runs of its matrix: model, workloads, run keys.

Planning is three steps, and only the last writes to the store:

- ``prepare`` makes what the runs use: every engine build per (revision, target) and
  llama-bench's GGUF files (it writes under build/, never the store); ``identities`` gives the
  same records without building anything, for judging stored runs (``audit --stored-only``).
- ``make_plan`` names every run of the matrix on the driver from those: the model hashed, every
  workload generated (its ids hashed), each run's key and job. It builds nothing and writes
  nothing.
- ``register_plan`` stores the reference rows (experiment, builds, models, workloads, devices),
  gives each run its row ids, and leaves out the runs already stored as ok unless ``force``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from db.store import Store
from devices.inventory import Device, Inventory
from harness import workloads
from harness.artifacts import Catalogue
from harness.build import BuildRecord, build_identity, git_output, sha256_file
from harness.engines import llamabench, lmc
from harness.engines.base import Artifact
from harness.engines.llamabench import NAME as LLAMA_BENCH
from harness.engines.llamabench import LlamaBenchConfig, LlamaBenchEngine
from harness.errors import InputError
from harness.matrix import (
    Cell,
    EngineConfig,
    Placement,
    WorkloadPoint,
    expand,
    interleave,
    resolve_placements,
    run_key,
)
from harness.runner import RunJob
from harness.spec import WORKTREE, Spec

# Settings that change how a run uses a workload, not the workload's ids.
RUN_SETTINGS = ("max_new",)

BuildFn = Callable[[list[tuple[str, str]]], dict[tuple[str, str], BuildRecord]]


@dataclass
class Materials:
    """What the runs use that must exist before they can be named: each engine build by
    (revision, target) (llama-bench's under the revision ``llama-bench``), and llama-bench's
    GGUF by type."""

    builds: dict[tuple[str, str], BuildRecord]
    gguf: dict[str, Artifact] = field(default_factory=dict)


@dataclass
class MaterialWorkload:
    kind: str
    params: dict[str, Any]  # what identifies it (run settings left out)
    hash: str
    ids: tuple[int, ...] | None
    answer: str | None
    needle_span: Any
    stop_id: int | None


@dataclass
class PlannedRun:
    key: str
    cell: Cell
    job: RunJob
    group: str  # warm-up group: (build, model); a board warms up once per group
    model_sha: str | None  # the model (or GGUF) the run reads, None for attn-bench
    answer: str | None
    # the rows it refers to: 0 / None until register_plan stored them
    experiment_id: int = 0
    build_id: int = 0
    model_id: int | None = None
    workload_id: int = 0
    attempts: int = 0  # tries so far (board losses)
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
    builds: dict[tuple[str, str], BuildRecord]
    models: dict[str, tuple[Path, dict[str, Any]]]  # sha256 -> (path, info) of each model
    workloads: dict[WorkloadPoint, MaterialWorkload]
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


def check_revisions(spec: Spec) -> None:
    for revision in spec.revisions:
        if revision == WORKTREE:
            continue
        try:
            git_output("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
        except InputError:
            raise InputError(f"{spec.path}: key 'revisions': {revision!r} is not a git revision "
                             f"of this repository (or use {WORKTREE!r} for the working tree)"
                             ) from None


def weights_sha256(model_dir: Path) -> str:
    """The identity of a model's weights: the sha256 of model.safetensors, or for a sharded
    checkpoint the sha256 of the lines "NAME SHA256" of its index and then of each shard (by
    name), so a change to any shard or to the index changes it."""
    single = model_dir / "model.safetensors"
    if single.is_file():
        return sha256_file(single)
    index = model_dir / "model.safetensors.index.json"
    if not index.is_file():
        raise InputError(f"model {model_dir}: neither model.safetensors nor "
                         "model.safetensors.index.json")
    try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{index}: no readable 'weight_map' ({exc!r})") from exc
    digest = hashlib.sha256()
    for name in [index.name, *shards]:
        if not isinstance(name, str) or "/" in name or not (model_dir / name).is_file():
            raise InputError(f"{index}: shard {name!r} is not a file in {model_dir}")
        digest.update(f"{name} {sha256_file(model_dir / name)}\n".encode())
    return digest.hexdigest()


def model_identity(model_dir: Path) -> tuple[str, dict[str, Any]]:
    sha = weights_sha256(model_dir)
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"model {model_dir}: unreadable config.json ({exc})") from exc
    return sha, config


def _identity_params(point: WorkloadPoint) -> dict[str, Any]:
    return {k: v for k, v in point.params if k not in RUN_SETTINGS}


def materialise(model_dir: Path | None, point: WorkloadPoint) -> MaterialWorkload:
    """Generate one workload (ids, answer); attn-bench data is synthetic."""
    params = _identity_params(point)
    answer, span, stop_id = None, None, None
    filler = params.get("filler", "grammar")  # spec settings, present only when set
    if point.kind == "needle":
        template = workloads.NeedleTemplate(
            needle=params.get("needle", workloads.DEFAULT_NEEDLE.needle),
            question=params.get("question", workloads.DEFAULT_NEEDLE.question))
        prompt = workloads.needle_prompt(model_dir, params["ctx"], params["depth"],
                                         params["seed"], filler, template)
        ids, content_hash, answer, span = prompt.ids, prompt.hash, prompt.answer, \
            prompt.needle_span
        stop_id = prompt.stop_ids[0] if prompt.stop_ids else None
    elif point.kind == "ppl":
        stream = workloads.ppl_tokens(model_dir, params["length"], params["seed"], filler,
                                      text=params.get("text"))
        ids, content_hash = stream.ids, stream.hash
    elif point.kind == "decode":
        stream = workloads.decode_prompt(model_dir, params["ctx"], params["seed"], filler)
        ids, content_hash = stream.ids, stream.hash
        stop_id = stream.stop_ids[0] if stream.stop_ids else None
    else:  # attn-bench: seeded synthetic data, identified by its parameters
        ids = None
        material = json.dumps({"kind": point.kind, **params}, sort_keys=True)
        content_hash = hashlib.sha256(material.encode()).hexdigest()
    return MaterialWorkload(point.kind, params, content_hash,
                            None if ids is None else tuple(ids), answer, span, stop_id)


def lmc_job(cell: Cell, record: BuildRecord, model_dir: Path | None, model_tree: str | None,
            material: MaterialWorkload, timeout_s: float,
            predictors: dict[str, Path] | None = None) -> RunJob:
    """The job of one lmc cell; ``predictors`` maps a gbm tree file's sha256 to its path."""
    predictors = predictors or {}
    config = cell.config
    assert isinstance(config, EngineConfig)
    return RunJob(
        run_key="",
        label=f"{cell.workload.label()} {config.policy}"
              + (f" k={config.k}" if config.k is not None and config.kv_budget is None else "")
              + (f" kv-budget={config.kv_budget}" if config.kv_budget is not None else ""),
        command=cell.workload.command,
        binary=record.binary,
        binary_sha256=record.binary_sha256,
        model_dir=None if model_dir is None else str(model_dir),
        model_sha256=None if model_dir is None else model_tree,
        ids=material.ids,
        options=lmc.options(cell.workload, config, material.stop_id),
        timeout_s=timeout_s,
        predictor=None if config.predictor is None else str(predictors[config.predictor]),
        predictor_sha256=config.predictor,
    )


def llama_job(cell: Cell, record: BuildRecord, artifact: Artifact, timeout_s: float) -> RunJob:
    config = cell.config
    assert isinstance(config, LlamaBenchConfig)
    return RunJob(
        run_key="",
        label=f"{cell.workload.label()} llama-bench {config.gguf_type}",
        command=LLAMA_BENCH,
        binary=record.binary,
        binary_sha256=record.binary_sha256,
        model_dir=str(artifact.path),
        model_sha256=artifact.sha256,
        model_file=True,  # one GGUF file, not a model folder
        ids=None,  # llama-bench makes its own tokens
        options=llamabench.options(cell.workload.get("ctx"), cell.workload.get("max_new"),
                                   config),
        timeout_s=timeout_s,
        engine=LLAMA_BENCH,
    )


def plan_archs(spec: Spec, inventory: Inventory,
               selectors: Sequence[str] | None = None) -> list[str]:
    """The architectures the spec's placements run on: what ``prepare`` builds for."""
    placements = resolve_placements(spec, list(inventory.devices.values()), selectors)
    return sorted({p.arch for p in placements})


def prepare(spec: Spec, archs: list[str], build: BuildFn) -> Materials:
    """Build every engine the spec runs for ``archs`` (cached: instant once built) and make
    llama-bench's GGUF files. Writes under build/ only."""
    check_revisions(spec)
    builds = build([(rev, arch) for rev in spec.revisions for arch in archs]) \
        if "lmc" in spec.engines else {}
    gguf: dict[str, Artifact] = {}
    axes = spec.llama_bench
    if axes is not None:
        engine = LlamaBenchEngine(axes.source, axes.rev)
        builds |= {(LLAMA_BENCH, arch): engine.build(arch) for arch in archs}
        gguf = {t: engine.artifact(spec.model, t, axes.gguf) for t in axes.gguf_type}
    return Materials(builds, gguf)


def identities(spec: Spec, archs: list[str]) -> Materials:
    """What ``prepare`` would return, with nothing built or written: enough to name the runs
    (their keys), not to execute them. lmc only: llama-bench's identity is that of a build and
    a GGUF conversion, which this does not make."""
    check_revisions(spec)
    if spec.llama_bench is not None:
        raise InputError(f"{spec.path}: judging stored runs without building is possible for "
                         "lmc experiments only; this one runs llama-bench (run it, or audit "
                         "without --stored-only)")
    return Materials({(rev, arch): build_identity(arch, None if rev == WORKTREE else rev)
                      for rev in spec.revisions for arch in archs})


def make_plan(spec: Spec, inventory: Inventory, materials: Materials,
              selectors: Sequence[str] | None = None) -> Plan:
    """Every run of the matrix, named: keys, jobs, warm-up groups. Builds nothing and writes
    nothing; ``register_plan`` stores it."""
    devices = list(inventory.devices.values())
    placements = resolve_placements(spec, devices, selectors)
    boards = {name: inventory.devices[name] for p in placements for name in p.devices}
    builds = materials.builds

    catalogue = Catalogue.empty()
    for record in builds.values():
        catalogue.add_file(Path(record.binary), record.binary_sha256)
    models: dict[str, tuple[Path, dict[str, Any]]] = {}
    model_sha, model_tree = None, None
    if spec.model is not None:
        model_sha, config = model_identity(spec.model)
        models[model_sha] = (spec.model, config)
        model_tree = catalogue.add_tree(spec.model)
    for artifact in materials.gguf.values():
        models[artifact.sha256] = (artifact.path, artifact.info)
        catalogue.add_file(artifact.path, artifact.sha256)
    predictors = {p.predictor.sha256: p.predictor.path for p in spec.engine.policies
                  if p.predictor is not None}
    for sha, path in predictors.items():
        catalogue.add_file(path, sha)

    materials_of: dict[WorkloadPoint, MaterialWorkload] = {}
    runs = []
    for cell in expand(spec, placements):
        material = materials_of.get(cell.workload)
        if material is None:
            material = materials_of[cell.workload] = materialise(spec.model, cell.workload)
        record = builds[(cell.revision, cell.placement.arch)]
        if isinstance(cell.config, LlamaBenchConfig):
            artifact = materials.gguf[cell.config.gguf_type]
            key_sha, uses_model = artifact.sha256, True
            job = llama_job(cell, record, artifact, spec.timeout_s)
        else:
            key_sha, uses_model = model_sha, cell.workload.kind != "attn-bench"
            job = lmc_job(cell, record, spec.model if uses_model else None, model_tree,
                          material, spec.timeout_s, predictors)
        key = run_key(asdict(record), key_sha, material.hash, cell)
        runs.append(PlannedRun(
            key=key, cell=cell, job=replace(job, run_key=key),
            group=f"{record.binary_sha256}/{key_sha if uses_model else '-'}",
            model_sha=key_sha if uses_model else None, answer=material.answer,
        ))
    # Two revisions with identical engine sources give identical keys: run such a cell once.
    runs = list({r.key: r for r in reversed(runs)}.values())[::-1]
    runs = interleave(runs, spec.order_seed, round_of=lambda r: r.cell.repeat)
    return Plan(spec, placements, boards, builds, models, materials_of, runs, catalogue)


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
        run.build_id = build_ids[(run.cell.revision, run.placement.arch)]
        run.model_id = None if run.model_sha is None else model_ids[run.model_sha]
        run.workload_id = workload_ids[run.cell.workload]
    done = set() if force else store.completed_run_keys([r.key for r in plan.runs])
    # run keys do not name the experiment: runs another experiment completed become this
    # one's too, so its summary, reports and audit tables include them
    store.link_runs(experiment_id, done)
    return replace(plan, experiment_id=experiment_id, device_ids=device_ids,
                   todo=[r for r in plan.runs if r.key not in done], force=force)
