"""How a ``RunResult`` becomes rows: its run (made on the first measurement), one measurement
and the measurement's child rows, written on the caller's connection inside its transaction
(``db.store.Store`` is the only caller, and the only writer of the store).

What reads would otherwise derive from every row is kept here as the rows change, in the same
transaction: ``refresh_runs`` sets each changed run's current measurement, status and number of
attempts, and moves the run between its experiments' counts per status
(``experiment_counts``); ``link`` counts a run into an experiment it joins.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, bindparam, exists, func, insert, select, update

from db.models import (
    RUN_KEPT,
    DecodeSteps,
    DeviceSnapshot,
    Experiment,
    ExperimentCount,
    ExperimentRun,
    Lease,
    Measurement,
    OutcomeRow,
    Run,
)
from db.packing import pack_steps
from db.records import RUN_STATUSES, RunResult

# Keeps IN (...) lists under every backend's limit on bound parameters.
KEY_CHUNK = 500
T = TypeVar("T")


def utc_naive(moment: datetime | None) -> datetime | None:
    """Timestamps are stored as naive UTC, the one form every backend round-trips unchanged."""
    if moment is None or moment.tzinfo is None:
        return moment
    return moment.astimezone(UTC).replace(tzinfo=None)


def now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def chunks(items: list[T]) -> Iterator[list[T]]:
    for start in range(0, len(items), KEY_CHUNK):
        yield items[start:start + KEY_CHUNK]


# A run's record and its rows are one definition: every column of ``runs`` and
# ``measurements`` but the store's own (ids, the attempt number, the lease check) comes from the
# RunResult field of the same name (tests/store/test_store.py holds them together).
RUN_TIMESTAMPS = ("started_at", "finished_at")
RUN_FIELDS = tuple(c.name for c in Run.__table__.columns if c.name not in ("id", *RUN_KEPT))
MEASUREMENT_FIELDS = tuple(c.name for c in Measurement.__table__.columns
                           if c.name not in ("id", "run_id", "attempt", "lease_expired"))
# A measurement that may still be completed: in flight, or given up by another coordinator.
OPEN_STATUSES = ("running", "lost")


@dataclass(frozen=True)
class Saved:
    """Where ``save_run`` stored a measurement, and whether its lease had expired."""

    run_id: int
    measurement_id: int
    lease_expired: bool


def _measurement_values(result: RunResult) -> dict[str, Any]:
    values = {name: getattr(result, name) for name in MEASUREMENT_FIELDS}
    for name in RUN_TIMESTAMPS:
        values[name] = utc_naive(values[name])
    return values


# The statements of every attempt, built once: a run's start and its result each run several,
# and building them per call cost more than running them. Parameters are named ``p_*`` so that
# none is taken for a column of a SET clause.
_RUNS, _MEASUREMENTS, _LINKS = Run.__table__, Measurement.__table__, ExperimentRun.__table__
_COUNTS = ExperimentCount.__table__
_EXPERIMENTS = Experiment.__table__


def _linked(run_id: Any) -> Any:
    """Whether the run is the experiment's (``p_experiment``) already, as a column."""
    return exists().where(_LINKS.c.experiment_id == bindparam("p_experiment"),
                          _LINKS.c.run_id == run_id).label("linked")


_RUN_ID = select(_RUNS.c.id, _linked(_RUNS.c.id)).where(
    _RUNS.c.run_key == bindparam("p_run_key"))
_INSERT_RUN = insert(_RUNS)
_INSERT_LINKS = insert(_LINKS)
_LIVE_LEASE = select(Lease.__table__.c.lease_id).where(
    Lease.__table__.c.lease_id == bindparam("p_lease_id"),
    Lease.__table__.c.expires >= bindparam("p_now"))
_LAST_ATTEMPT = select(func.max(_MEASUREMENTS.c.attempt)).where(
    _MEASUREMENTS.c.run_id == bindparam("p_run"))
_INSERT_MEASUREMENT = insert(_MEASUREMENTS)
# an attempt to complete: its run, its status, whether the result's lease is live and whether
# the run is the result's experiment's, in one statement
_OPEN_ATTEMPT = select(
    _MEASUREMENTS.c.run_id, _MEASUREMENTS.c.status, _RUNS.c.run_key,
    _LIVE_LEASE.scalar_subquery().label("live"), _linked(_MEASUREMENTS.c.run_id)).select_from(
    _MEASUREMENTS.join(_RUNS, _RUNS.c.id == _MEASUREMENTS.c.run_id)).where(
    _MEASUREMENTS.c.id == bindparam("p_id"))
_COMPLETE = update(_MEASUREMENTS).where(_MEASUREMENTS.c.id == bindparam("p_id"))
_INSERT_STEPS = insert(DecodeSteps.__table__)
_INSERT_SNAPSHOTS = insert(DeviceSnapshot.__table__)
_INSERT_OUTCOME = insert(OutcomeRow.__table__)
# refresh_runs: the runs' kept columns with all their measurements (a run has a few), the kept
# columns set, the runs' experiments, and a count moved
_RUNS_MEASURED = select(
    _RUNS.c.id, _RUNS.c.status, _RUNS.c.current_measurement_id, _RUNS.c.attempts,
    _MEASUREMENTS.c.id, _MEASUREMENTS.c.status, _MEASUREMENTS.c.lease_expired).join(
    _MEASUREMENTS, _MEASUREMENTS.c.run_id == _RUNS.c.id).where(
    _RUNS.c.id.in_(bindparam("p_runs", expanding=True)))
_KEEP = update(_RUNS).where(_RUNS.c.id == bindparam("p_run")).values(
    current_measurement_id=bindparam("p_current"), status=bindparam("p_status"),
    attempts=bindparam("p_attempts"))
_EXPERIMENTS_OF = select(_LINKS.c.experiment_id, _LINKS.c.run_id).where(
    _LINKS.c.run_id.in_(bindparam("p_runs", expanding=True)))
# the experiments of the runs (``p_runs``) were written once more
_WRITTEN = update(_EXPERIMENTS).where(_EXPERIMENTS.c.id.in_(
    select(_LINKS.c.experiment_id).where(_LINKS.c.run_id.in_(bindparam("p_runs", expanding=True)))
)).values(writes=_EXPERIMENTS.c.writes + 1)
_COUNT = update(_COUNTS).where(_COUNTS.c.experiment_id == bindparam("p_experiment"),
                               _COUNTS.c.status == bindparam("p_status")).values(
    runs=_COUNTS.c.runs + bindparam("p_delta"))


@dataclass(frozen=True)
class RunRow:
    id: int
    new: bool  # made just now: no measurement and no experiment link yet


def ensure_run(conn: Connection, result: RunResult) -> RunRow:
    """The run's row (made from the result on its first measurement), linked to the result's
    experiment. A run's identity never changes once stored."""
    row = conn.execute(_RUN_ID, {"p_run_key": result.run_key,
                                 "p_experiment": result.experiment_id}).first()
    if row is not None:
        if not row.linked:
            link(conn, result.experiment_id, [row.id])
        return RunRow(row.id, False)
    values = {name: getattr(result, name) for name in RUN_FIELDS}
    values["config"] = dict(result.config)
    run_id = conn.execute(_INSERT_RUN, values).inserted_primary_key[0]
    # a new run has no status yet: refresh_runs counts it in once it has one
    conn.execute(_INSERT_LINKS, [{"experiment_id": result.experiment_id, "run_id": run_id}])
    return RunRow(run_id, True)


def lease_expired(conn: Connection, result: RunResult) -> bool:
    """Whether the lease the result was made under is no longer live (expired, released, or
    the board's lease passed to another coordinator)."""
    if result.lease_id is None:
        return False
    live = conn.scalar(_LIVE_LEASE, {"p_lease_id": result.lease_id, "p_now": now()})
    return live is None


def append(conn: Connection, run: RunRow, result: RunResult, expired: bool) -> int:
    last = None if run.new else conn.scalar(_LAST_ATTEMPT, {"p_run": run.id})
    return conn.execute(_INSERT_MEASUREMENT, {
        "run_id": run.id, "attempt": (last or 0) + 1, "lease_expired": expired,
        **_measurement_values(result)}).inserted_primary_key[0]


def open_attempt(conn: Connection, result: RunResult, measurement_id: int) -> tuple[int, bool]:
    """The run of an open attempt of the result's run (running, or lost: see OPEN_STATUSES),
    linked to the result's experiment, and whether the result's lease is no longer live (as
    ``lease_expired``); ValueError when it is no open attempt of that run."""
    row = conn.execute(_OPEN_ATTEMPT, {"p_id": measurement_id, "p_lease_id": result.lease_id,
                                       "p_now": now(),
                                       "p_experiment": result.experiment_id}).first()
    if row is None or row.run_key != result.run_key or row.status not in OPEN_STATUSES:
        raise ValueError(f"run {result.run_key}: measurement {measurement_id} is not an open "
                         f"attempt of this run ({'none' if row is None else row.status})")
    if not row.linked:
        link(conn, result.experiment_id, [row.run_id])
    return row.run_id, result.lease_id is not None and row.live is None


def complete(conn: Connection, measurement_id: int, result: RunResult, expired: bool) -> None:
    """Complete an open attempt (see open_attempt) with the result."""
    values = _measurement_values(result)
    if values["started_at"] is None:  # keep when the attempt started
        del values["started_at"]
    conn.execute(_COMPLETE, {"p_id": measurement_id, "lease_expired": expired, **values})


def link(conn: Connection, experiment_id: int, run_ids: list[int]) -> None:
    """Add the missing (experiment, run) memberships, and count the runs in the experiment's
    counts per status."""
    joined: dict[str, int] = {}
    for chunk in chunks(run_ids):
        linked = set(conn.scalars(select(_LINKS.c.run_id).where(
            _LINKS.c.experiment_id == experiment_id, _LINKS.c.run_id.in_(chunk))))
        new = [i for i in chunk if i not in linked]
        if not new:
            continue
        conn.execute(_INSERT_LINKS, [{"experiment_id": experiment_id, "run_id": i} for i in new])
        conn.execute(update(_EXPERIMENTS).where(_EXPERIMENTS.c.id == experiment_id)
                     .values(writes=_EXPERIMENTS.c.writes + 1))
        for status, n in conn.execute(select(_RUNS.c.status, func.count())
                                      .where(_RUNS.c.id.in_(new), _RUNS.c.status.is_not(None))
                                      .group_by(_RUNS.c.status)):
            joined[status] = joined.get(status, 0) + n
    _count(conn, {(experiment_id, status): n for status, n in joined.items()})


def add_counts(conn: Connection, experiment_id: int) -> None:
    """The experiment's counts per status, all zero (made with the experiment)."""
    have = set(conn.scalars(select(_COUNTS.c.status)
                            .where(_COUNTS.c.experiment_id == experiment_id)))
    missing = [{"experiment_id": experiment_id, "status": status, "runs": 0}
               for status in RUN_STATUSES if status not in have]
    if missing:
        conn.execute(insert(_COUNTS), missing)


def _count(conn: Connection, deltas: dict[tuple[int, str], int]) -> None:
    """Add ``deltas`` to the experiments' counts per status, in one order (experiment, status)
    so that coordinators sharing a PostgreSQL store take the rows' locks in the same order."""
    for (experiment_id, status), delta in sorted(deltas.items()):
        if delta:
            conn.execute(_COUNT, {"p_experiment": experiment_id, "p_status": status,
                                  "p_delta": delta})


def refresh_runs(conn: Connection, run_ids: list[int]) -> None:
    """Each run's current measurement (its latest ok one made under a live lease, else its
    latest: db.measurements), status and number of attempts, from its measurements now; a run
    whose status changed moves between its experiments' counts; the runs' experiments count
    one more write (``experiments.writes``, before the counts: one order of row locks)."""
    for chunk in chunks(sorted(set(run_ids))):
        conn.execute(_WRITTEN, {"p_runs": chunk})
        kept: dict[int, tuple[str | None, int | None, int]] = {}
        measured: dict[int, list[tuple[int, str, bool]]] = {}
        for run_id, run_status, current, attempts, measurement, status, expired in conn.execute(
                _RUNS_MEASURED, {"p_runs": chunk}):
            kept[run_id] = (run_status, current, attempts)
            measured.setdefault(run_id, []).append((measurement, status, bool(expired)))
        moved: dict[int, tuple[str | None, str]] = {}
        for run_id, attempts in measured.items():
            counted = [m for m, status, expired in attempts if status == "ok" and not expired]
            current = max(counted) if counted else max(m for m, _, _ in attempts)
            status = next(s for m, s, _ in attempts if m == current)
            if kept[run_id] != (status, current, len(attempts)):
                conn.execute(_KEEP, {"p_run": run_id, "p_current": current, "p_status": status,
                                     "p_attempts": len(attempts)})
            if kept[run_id][0] != status:
                moved[run_id] = (kept[run_id][0], status)
        if not moved:
            continue
        deltas: dict[tuple[int, str], int] = {}
        for experiment_id, run_id in conn.execute(_EXPERIMENTS_OF, {"p_runs": list(moved)}):
            old, new = moved[run_id]
            if old is not None:
                deltas[(experiment_id, old)] = deltas.get((experiment_id, old), 0) - 1
            deltas[(experiment_id, new)] = deltas.get((experiment_id, new), 0) + 1
        _count(conn, deltas)


# What reports read of every snapshot (reports.runs: its flags and CPU; the audit: the load
# before the run), kept beside the compressed fingerprint as ``device_snapshots.summary``: a
# report of 100,000 runs then reads no fingerprint but each board's first. A fingerprint taken
# by devices.fingerprint carries its flags, judged when it was taken (devices.conditions).
SUMMARY_KEYS = ("flags", "cpu_model", "cpu", "cpu_id", "loadavg")
# One stored without them (older, or hand-made) is judged when it is read, as before summaries:
# its summary also keeps what devices.conditions judges from (tests/store/test_snapshot_summary
# checks that a summary and its fingerprint are judged alike).
JUDGED_KEYS = ("emulated", "cores", "thermal", "devfreq", "mem_total_kb", "mem_available_kb")


def snapshot_summary(fingerprint: Any) -> dict[str, Any]:
    """The part of a fingerprint that reports read of every snapshot (SUMMARY_KEYS, and
    JUDGED_KEYS when it carries no flags)."""
    if not isinstance(fingerprint, dict):
        return {}
    keys = SUMMARY_KEYS if isinstance(fingerprint.get("flags"), list) else (*SUMMARY_KEYS,
                                                                             *JUDGED_KEYS)
    return {key: fingerprint[key] for key in keys if fingerprint.get(key) is not None}


def insert_children(conn: Connection, measurement_id: int, result: RunResult) -> None:
    if result.token_timings:
        conn.execute(_INSERT_STEPS, {"measurement_id": measurement_id,
                                     **pack_steps(result.token_timings)})
    if result.snapshots:
        conn.execute(_INSERT_SNAPSHOTS, [
            {"measurement_id": measurement_id, "phase": s.phase, "taken_at": utc_naive(s.taken_at),
             "fingerprint": dict(s.fingerprint),
             "summary": snapshot_summary(s.fingerprint)}
            for s in result.snapshots
        ])
    if result.outcome is not None:
        values = asdict(result.outcome)
        values["extra"] = dict(values["extra"] or {})
        conn.execute(_INSERT_OUTCOME, {"measurement_id": measurement_id, **values})
