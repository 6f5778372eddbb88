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

from sqlalchemy import Connection, case, func, insert, select, update

from db.models import (
    RUN_KEPT,
    DecodeSteps,
    DeviceSnapshot,
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


def ensure_run(conn: Connection, result: RunResult) -> int:
    """The run's row (made from the result on its first measurement), linked to the result's
    experiment. A run's identity never changes once stored."""
    runs = Run.__table__
    run_id = conn.scalar(select(runs.c.id).where(runs.c.run_key == result.run_key))
    if run_id is None:
        values = {name: getattr(result, name) for name in RUN_FIELDS}
        values["config"] = dict(result.config)
        run_id = conn.execute(insert(runs).values(**values)).inserted_primary_key[0]
    link(conn, result.experiment_id, [run_id])
    return run_id


def lease_expired(conn: Connection, result: RunResult) -> bool:
    """Whether the lease the result was made under is no longer live (expired, released, or
    the board's lease passed to another coordinator)."""
    if result.lease_id is None:
        return False
    leases = Lease.__table__
    live = conn.scalar(select(leases.c.lease_id).where(leases.c.lease_id == result.lease_id,
                                                       leases.c.expires >= now()))
    return live is None


def append(conn: Connection, run_id: int, result: RunResult, expired: bool) -> int:
    table = Measurement.__table__
    last = conn.scalar(select(func.max(table.c.attempt)).where(table.c.run_id == run_id))
    return conn.execute(insert(table).values(
        run_id=run_id, attempt=(last or 0) + 1, lease_expired=expired,
        **_measurement_values(result))).inserted_primary_key[0]


def complete(conn: Connection, run_id: int, measurement_id: int, result: RunResult,
              expired: bool) -> None:
    table = Measurement.__table__
    row = conn.execute(select(table.c.run_id, table.c.status)
                       .where(table.c.id == measurement_id)).first()
    if row is None or row.run_id != run_id or row.status not in OPEN_STATUSES:
        raise ValueError(f"run {result.run_key}: measurement {measurement_id} is not an open "
                         f"attempt of this run ({'none' if row is None else row.status})")
    values = _measurement_values(result)
    if values["started_at"] is None:  # keep when the attempt started
        del values["started_at"]
    conn.execute(update(table).where(table.c.id == measurement_id)
                 .values(lease_expired=expired, **values))


def link(conn: Connection, experiment_id: int, run_ids: list[int]) -> None:
    """Add the missing (experiment, run) memberships, and count the runs in the experiment's
    counts per status."""
    links = ExperimentRun.__table__
    runs = Run.__table__
    joined: dict[str, int] = {}
    for chunk in chunks(run_ids):
        linked = set(conn.scalars(select(links.c.run_id).where(
            links.c.experiment_id == experiment_id, links.c.run_id.in_(chunk))))
        new = [i for i in chunk if i not in linked]
        if not new:
            continue
        conn.execute(insert(links), [{"experiment_id": experiment_id, "run_id": i} for i in new])
        for status, n in conn.execute(select(runs.c.status, func.count())
                                      .where(runs.c.id.in_(new), runs.c.status.is_not(None))
                                      .group_by(runs.c.status)):
            joined[status] = joined.get(status, 0) + n
    _count(conn, {(experiment_id, status): n for status, n in joined.items()})


def add_counts(conn: Connection, experiment_id: int) -> None:
    """The experiment's counts per status, all zero (made with the experiment)."""
    table = ExperimentCount.__table__
    have = set(conn.scalars(select(table.c.status).where(table.c.experiment_id == experiment_id)))
    missing = [{"experiment_id": experiment_id, "status": status, "runs": 0}
               for status in RUN_STATUSES if status not in have]
    if missing:
        conn.execute(insert(table), missing)


def _count(conn: Connection, deltas: dict[tuple[int, str], int]) -> None:
    """Add ``deltas`` to the experiments' counts per status, in one order (experiment, status)
    so that coordinators sharing a PostgreSQL store take the rows' locks in the same order."""
    table = ExperimentCount.__table__
    by_move: dict[tuple[tuple[str, int], ...], list[int]] = {}
    for experiment_id in sorted({e for e, _ in deltas}):
        move = tuple(sorted((s, d) for (e, s), d in deltas.items() if e == experiment_id and d))
        if move:
            by_move.setdefault(move, []).append(experiment_id)
    for move, experiments in by_move.items():  # usually one: a run moved from one status
        change = case(*((table.c.status == status, delta) for status, delta in move), else_=0)
        conn.execute(update(table).where(table.c.experiment_id.in_(experiments),
                                         table.c.status.in_([s for s, _ in move]))
                     .values(runs=table.c.runs + change))


def refresh_runs(conn: Connection, run_ids: list[int]) -> None:
    """Each run's current measurement (its latest ok one made under a live lease, else its
    latest: db.measurements), status and number of attempts, from its measurements now; a run
    whose status changed moves between its experiments' counts."""
    runs, table, links = Run.__table__, Measurement.__table__, ExperimentRun.__table__
    for chunk in chunks(sorted(set(run_ids))):
        # one read: each run's kept status and all its measurements (a run has a few)
        rows = conn.execute(
            select(runs.c.id, runs.c.status, runs.c.current_measurement_id, runs.c.attempts,
                   table.c.id, table.c.status, table.c.lease_expired)
            .join(table, table.c.run_id == runs.c.id).where(runs.c.id.in_(chunk))).all()
        kept: dict[int, tuple[str | None, int | None, int]] = {}
        measured: dict[int, list[tuple[int, str, bool]]] = {}
        for run_id, run_status, current, attempts, measurement, status, expired in rows:
            kept[run_id] = (run_status, current, attempts)
            measured.setdefault(run_id, []).append((measurement, status, bool(expired)))
        moved: dict[int, tuple[str | None, str]] = {}
        for run_id, attempts in measured.items():
            counted = [m for m, status, expired in attempts if status == "ok" and not expired]
            current = max(counted) if counted else max(m for m, _, _ in attempts)
            status = next(s for m, s, _ in attempts if m == current)
            if kept[run_id] != (status, current, len(attempts)):
                conn.execute(update(runs).where(runs.c.id == run_id).values(
                    current_measurement_id=current, status=status, attempts=len(attempts)))
            if kept[run_id][0] != status:
                moved[run_id] = (kept[run_id][0], status)
        if not moved:
            continue
        deltas: dict[tuple[int, str], int] = {}
        for experiment_id, run_id in conn.execute(
                select(links.c.experiment_id, links.c.run_id).where(links.c.run_id.in_(moved))):
            old, new = moved[run_id]
            if old is not None:
                deltas[(experiment_id, old)] = deltas.get((experiment_id, old), 0) - 1
            deltas[(experiment_id, new)] = deltas.get((experiment_id, new), 0) + 1
        _count(conn, deltas)


def insert_children(conn: Connection, measurement_id: int, result: RunResult) -> None:
    if result.token_timings:
        conn.execute(insert(DecodeSteps.__table__).values(
            measurement_id=measurement_id, **pack_steps(result.token_timings)))
    if result.snapshots:
        conn.execute(insert(DeviceSnapshot.__table__), [
            {"measurement_id": measurement_id, "phase": s.phase, "taken_at": utc_naive(s.taken_at),
             "fingerprint": dict(s.fingerprint)}
            for s in result.snapshots
        ])
    if result.outcome is not None:
        values = asdict(result.outcome)
        values["extra"] = dict(values["extra"] or {})
        conn.execute(insert(OutcomeRow.__table__).values(measurement_id=measurement_id,
                                                         **values))
