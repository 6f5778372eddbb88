"""Read-side helpers behind ``Store.list_runs``, ``get_run``, ``experiment_summary``,
``experiment_lines`` and ``run_durations``: the listings and summaries the CLI, `status` and
the dashboard show.

Which measurement of a run they read is db.measurements' choice. They return plain
dataclasses; no ORM object escapes the session that loaded it. The raw rows as pandas
DataFrames, for reports and export, are db.frames'.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, func, inspect, select
from sqlalchemy.orm import Session

from db.errors import StoreInputError
from db.measurements import counted_ok
from db.models import (
    Build,
    DecodeSteps,
    Device,
    DeviceSnapshot,
    Experiment,
    ExperimentCount,
    ExperimentRun,
    Measurement,
    Model,
    OutcomeRow,
    Run,
    Workload,
)
from db.packing import unpack_steps
from db.records import AXIS_COLUMNS, RUN_STATUSES, TokenTiming


@dataclass
class RunListing:
    """One line of `benchfarm runs list`."""

    id: int
    run_key: str
    experiment: str
    device: str
    command: str
    policy: str | None
    k: int | None
    repeat: int
    status: str  # the current measurement's (see current_measurements)
    decode_ms_per_token: float | None
    recall: float | None
    ppl: float | None
    finished_at: datetime | None
    error: str | None
    revision: str | None  # the engine build's (a commit, "+dirty" for a changed work tree)
    measurements: int  # attempts stored


@dataclass
class MeasurementDetail:
    """One attempt at a run: every column of its row, its outcome, snapshots and timings."""

    measurement: dict[str, Any]
    outcome: dict[str, Any] | None
    snapshots: list[dict[str, Any]]
    token_timings: list[TokenTiming]


@dataclass
class RunDetail:
    """Everything stored about one run (`benchfarm runs show`, `benchfarm reproduce`).

    ``run`` is the runs row with its current measurement's columns (``measurement_id`` names
    it); ``outcome``, ``snapshots`` and ``token_timings`` are that measurement's. Every attempt,
    oldest first, is in ``measurements``.
    """

    run: dict[str, Any]
    experiment: str
    device: dict[str, Any]
    build: dict[str, Any] | None
    model: dict[str, Any] | None
    workload: dict[str, Any] | None
    outcome: dict[str, Any] | None
    snapshots: list[dict[str, Any]]
    token_timings: list[TokenTiming]
    measurements: list[MeasurementDetail]


@dataclass
class GroupSummary:
    """The ok runs of one (command, policy, k, device, engine revision) cell of an experiment
    (revisions are never pooled)."""

    command: str
    policy: str | None
    k: int | None
    device: str
    revision: str | None  # the engine build's revision (a commit, +dirty for a working tree)
    runs: int
    decode_ms_per_token: float | None  # medians over the runs
    attn_ms_per_token: float | None
    overhead_ms: float | None
    recall: float | None  # mean over the runs
    ppl: float | None  # median


@dataclass
class ExperimentSummary:
    name: str
    spec_hash: str
    created_at: datetime
    updated_at: datetime
    counts: dict[str, int]  # runs per status, every status present (0 when none)
    devices: dict[str, dict[str, int]]  # device name -> runs per status
    groups: list[GroupSummary] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _row_dict(obj: Any) -> dict[str, Any]:
    return {attr.key: getattr(obj, attr.key) for attr in inspect(obj).mapper.column_attrs}


def experiment_row(session: Session, name: str) -> Experiment:
    """The experiment named ``name``; a StoreInputError naming the stored ones if none is."""
    row = session.scalar(select(Experiment).where(Experiment.name == name))
    if row is None:
        known = ", ".join(list_experiments(session)) or "none yet"
        raise StoreInputError(f"no experiment named {name!r} in the store (known: {known})")
    return row


def experiment_members(experiment_id: int) -> Select:
    """Ids of the runs that belong to the experiment (see models.ExperimentRun)."""
    return select(ExperimentRun.run_id).where(ExperimentRun.experiment_id == experiment_id)


def list_experiments(session: Session) -> list[str]:
    return list(session.scalars(select(Experiment.name).order_by(Experiment.name)))


@dataclass
class ExperimentLine:
    """One experiment as `benchfarm status` lists it: its runs per status (kept as runs land,
    ``experiment_counts``), its last run, and its baseline's failures as kept."""

    name: str
    updated_at: datetime
    counts: dict[str, int]  # every status, 0 when none
    writes: int  # experiments.writes: what the kept baseline was found at
    # its exact-attention baseline's failures, "" for none (experiments.baseline); None when
    # not kept for its runs as they are now (runs landed since, or never found out)
    baseline: str | None

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def experiment_lines(session: Session, limit: int | None = None, offset: int = 0,
                     newest_first: bool = False) -> list[ExperimentLine]:
    """The experiments in name order (or the most recently run first), ``limit`` of them from
    ``offset`` on: a few rows each, whatever the number of their runs."""
    order = (Experiment.updated_at.desc(), Experiment.name) if newest_first \
        else (Experiment.name,)
    page = select(Experiment.id, Experiment.name, Experiment.updated_at, Experiment.writes,
                  Experiment.baseline, Experiment.baseline_writes).order_by(*order).offset(offset)
    if limit is not None:
        page = page.limit(limit)
    experiments = session.execute(page).all()
    counts: dict[int, dict[str, int]] = {e.id: dict.fromkeys(RUN_STATUSES, 0)
                                         for e in experiments}
    for experiment_id, status, runs in session.execute(
            select(ExperimentCount.experiment_id, ExperimentCount.status, ExperimentCount.runs)
            .where(ExperimentCount.experiment_id.in_(list(counts)))):
        counts[experiment_id][status] = runs
    return [ExperimentLine(e.name, e.updated_at, counts[e.id], e.writes,
                           e.baseline if e.baseline_writes == e.writes else None)
            for e in experiments]


def count_experiments(session: Session) -> int:
    return int(session.scalar(select(func.count()).select_from(Experiment)))


@dataclass
class RunDuration:
    """How long one stored ok run took (for estimates of runs not done yet)."""

    device: str
    engine: str
    command: str
    columns: dict[str, Any]  # the run's axis columns (AXIS_COLUMNS)
    workload: dict[str, Any]  # the workload parameters the run was planned with
    wall_ms: float


def run_durations(session: Session) -> list[RunDuration]:
    axes = [getattr(Run, name) for name in AXIS_COLUMNS]
    query = (select(Device.name, Run.engine, Run.command, Run.config, Measurement.wall_ms,
                    *axes)
             .join(Measurement, Measurement.run_id == Run.id)
             .join(Device, Measurement.device_id == Device.id)
             .where(counted_ok(), Measurement.wall_ms.is_not(None)))
    return [RunDuration(device, engine, command, dict(zip(AXIS_COLUMNS, values, strict=True)),
                        dict((config or {}).get("workload") or {}), wall_ms)
            for device, engine, command, config, wall_ms, *values in session.execute(query)]


def list_runs(session: Session, experiment: str | None, status: str | None,
              limit: int | None = None, offset: int = 0) -> list[RunListing]:
    """The runs in id order (of ``experiment``; with ``status``), ``limit`` of them from
    ``offset`` on: each read through its current measurement, kept on its row."""
    query = (
        select(Run.id, Run.run_key, Run.command, Run.policy, Run.k, Run.repeat, Run.attempts,
               Measurement.status, Measurement.decode_ms_per_token, Measurement.finished_at,
               Measurement.error, Experiment.name, Device.name, Build.revision,
               OutcomeRow.recall, OutcomeRow.ppl)
        .join(Experiment, Run.experiment_id == Experiment.id)
        .join(Measurement, Measurement.id == Run.current_measurement_id)
        .join(Device, Measurement.device_id == Device.id)
        .outerjoin(Build, Run.build_id == Build.id)
        .outerjoin(OutcomeRow, OutcomeRow.measurement_id == Measurement.id)
        .where(*_run_filter(session, experiment, status))
        .order_by(Run.id).offset(offset)
    )
    if limit is not None:
        query = query.limit(limit)
    # Filtered by experiment, a shared run is listed under the experiment asked for.
    return [
        RunListing(id=run_id, run_key=key, experiment=experiment or exp, device=dev,
                   command=command, policy=policy, k=k, repeat=repeat, status=state,
                   decode_ms_per_token=decode, recall=recall, ppl=ppl, finished_at=finished,
                   error=error, revision=revision, measurements=attempts)
        for (run_id, key, command, policy, k, repeat, attempts, state, decode, finished, error,
             exp, dev, revision, recall, ppl) in session.execute(query)
    ]


def count_runs(session: Session, experiment: str | None, status: str | None) -> int:
    """How many runs ``list_runs`` lists without a limit: an experiment's from its counts per
    status, kept as runs land."""
    if experiment is not None:
        exp_id = experiment_row(session, experiment).id
        counts = select(func.coalesce(func.sum(ExperimentCount.runs), 0)).where(
            ExperimentCount.experiment_id == exp_id)
        if status is not None:
            counts = counts.where(ExperimentCount.status == _status(status))
        return int(session.scalar(counts))
    return int(session.scalar(select(func.count()).select_from(Run)
                              .where(*_run_filter(session, None, status))))


def _status(status: str) -> str:
    if status not in RUN_STATUSES:
        raise StoreInputError(f"run status {status!r}: allowed {', '.join(RUN_STATUSES)}")
    return status


def _run_filter(session: Session, experiment: str | None,
                status: str | None) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = [Run.current_measurement_id.is_not(None)]
    if status is not None:
        conditions.append(Run.status == _status(status))
    if experiment is not None:
        exp_id = experiment_row(session, experiment).id
        conditions.append(Run.id.in_(experiment_members(exp_id)))
    return conditions


MIN_KEY_PREFIX = 6
# Row ids are 64-bit signed integers in every backend; a larger number names no row.
MAX_ROW_ID = 2**63 - 1


def get_run(session: Session, run_id_or_key: int | str) -> RunDetail:
    """The run with this key, else this id (a number), else the one key with this prefix."""
    text = str(run_id_or_key).strip()
    run = session.scalar(select(Run).where(Run.run_key == text))
    if run is None and text.isascii() and text.isdigit() and int(text) <= MAX_ROW_ID:
        run = session.get(Run, int(text))
    if run is None and len(text) >= MIN_KEY_PREFIX:
        # `runs list` shows key prefixes; accept one when it names a single run.
        matches = session.scalars(
            select(Run).where(Run.run_key.startswith(text, autoescape=True)).limit(2)).all()
        if len(matches) > 1:
            raise StoreInputError(f"run key prefix {text!r} matches several runs; give more "
                                  "characters or the run id")
        run = matches[0] if matches else None
    if run is None:
        raise StoreInputError(f"no run with id or key {text!r} in the store "
                              "(see `benchfarm runs list`)")

    def related(model: type, row_id: int | None) -> dict[str, Any] | None:
        return None if row_id is None else _row_dict(session.get(model, row_id))

    measurements = [_measurement_detail(session, m) for m in session.scalars(
        select(Measurement).where(Measurement.run_id == run.id).order_by(Measurement.id))]
    # the current one, as current_measurements chooses it: the latest counted ok, else the last
    current = next((m for m in reversed(measurements) if m.measurement["status"] == "ok"
                    and not m.measurement["lease_expired"]), measurements[-1])
    measured = {k: v for k, v in current.measurement.items() if k not in ("id", "run_id")}
    row = _row_dict(run) | measured | {"measurement_id": current.measurement["id"]}
    return RunDetail(
        run=row,
        experiment=session.get(Experiment, run.experiment_id).name,
        device=related(Device, current.measurement["device_id"]),
        build=related(Build, run.build_id),
        model=related(Model, run.model_id),
        workload=related(Workload, run.workload_id),
        outcome=current.outcome, snapshots=current.snapshots,
        token_timings=current.token_timings, measurements=measurements,
    )


def _measurement_detail(session: Session, measurement: Measurement) -> MeasurementDetail:
    outcome = session.get(OutcomeRow, measurement.id)
    snapshots = session.scalars(select(DeviceSnapshot).where(
        DeviceSnapshot.measurement_id == measurement.id).order_by(DeviceSnapshot.id))
    steps = session.get(DecodeSteps, measurement.id)
    return MeasurementDetail(
        measurement=_row_dict(measurement),
        outcome=None if outcome is None else _row_dict(outcome),
        snapshots=[_row_dict(s) for s in snapshots],
        token_timings=[] if steps is None else unpack_steps(steps.tokens, steps.ms,
                                                           steps.attn_ms),
    )


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def summarize_groups(rows: Iterable[Any]) -> list[GroupSummary]:
    """The ok runs' rows (command, policy, k, name: the device, revision and their figures)
    in groups per (command, policy, k, device, revision), in that order (None first)."""
    cells: dict[tuple, list[Any]] = defaultdict(list)
    for row in rows:
        cells[(row.command, row.policy, row.k, row.name, row.revision)].append(row)
    return [
        GroupSummary(
            command=command, policy=policy, k=k, device=device, revision=revision,
            runs=len(cell),
            decode_ms_per_token=_median([r.decode_ms_per_token for r in cell]),
            attn_ms_per_token=_median([r.attn_ms_per_token for r in cell]),
            overhead_ms=_median([r.overhead_ms for r in cell]),
            recall=_mean([r.recall for r in cell]),
            ppl=_median([r.ppl for r in cell]),
        )
        # Sort key: None sorts first (policy "exact" has no k).
        for (command, policy, k, device, revision), cell in sorted(
            cells.items(), key=lambda item: tuple((v is not None, v) for v in item[0]))
    ]


# what summarize_groups reads of each run, through its current measurement
GROUP_COLUMNS = (Run.command, Run.policy, Run.k, Device.name, Build.revision, Measurement.status,
                 Measurement.decode_ms_per_token, Measurement.attn_ms_per_token,
                 Measurement.overhead_ms, OutcomeRow.recall, OutcomeRow.ppl)


def group_rows() -> Select:
    """GROUP_COLUMNS of runs, through their current measurement, device, build and outcome."""
    return (select(*GROUP_COLUMNS)
            .join(Measurement, Measurement.id == Run.current_measurement_id)
            .join(Device, Measurement.device_id == Device.id)
            .outerjoin(Build, Build.id == Run.build_id)
            .outerjoin(OutcomeRow, OutcomeRow.measurement_id == Measurement.id))


def experiment_summary(session: Session, name: str) -> ExperimentSummary:
    """Counts per status of the runs' current measurements (a run counts once), and medians
    over the runs whose current measurement is ok."""
    exp = experiment_row(session, name)
    rows = session.execute(
        group_rows().where(Run.id.in_(experiment_members(exp.id)))).all()
    counts = Counter(row.status for row in rows)
    devices: dict[str, Counter[str]] = defaultdict(Counter)
    for row in rows:
        devices[row.name][row.status] += 1
    groups = summarize_groups(row for row in rows if row.status == "ok")
    return ExperimentSummary(
        name=exp.name, spec_hash=exp.spec_hash, created_at=exp.created_at,
        updated_at=exp.updated_at,
        counts={status: counts.get(status, 0) for status in RUN_STATUSES},
        devices={dev: {s: c.get(s, 0) for s in RUN_STATUSES} for dev, c in sorted(devices.items())},
        groups=groups,
    )
