"""How a ``RunResult`` becomes rows: its run (made on the first measurement), one measurement
and the measurement's child rows, written on the caller's connection inside its transaction
(``db.store.Store`` is the only caller, and the only writer of the store).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, bindparam, exists, func, insert, select, update

from db.models import (
    DeviceSnapshot,
    ExperimentRun,
    Lease,
    Measurement,
    OutcomeRow,
    Run,
    TokenTimingRow,
)
from db.records import RunResult, TokenTiming

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
RUN_FIELDS = tuple(c.name for c in Run.__table__.columns if c.name != "id")
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
_INSERT_SNAPSHOTS = insert(DeviceSnapshot.__table__)
_INSERT_OUTCOME = insert(OutcomeRow.__table__)


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
            conn.execute(_INSERT_LINKS, [{"experiment_id": result.experiment_id,
                                          "run_id": row.id}])
        return RunRow(row.id, False)
    values = {name: getattr(result, name) for name in RUN_FIELDS}
    values["config"] = dict(result.config)
    run_id = conn.execute(_INSERT_RUN, values).inserted_primary_key[0]
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
        conn.execute(_INSERT_LINKS, [{"experiment_id": result.experiment_id,
                                      "run_id": row.run_id}])
    return row.run_id, result.lease_id is not None and row.live is None


def complete(conn: Connection, measurement_id: int, result: RunResult, expired: bool) -> None:
    """Complete an open attempt (see open_attempt) with the result."""
    values = _measurement_values(result)
    if values["started_at"] is None:  # keep when the attempt started
        del values["started_at"]
    conn.execute(_COMPLETE, {"p_id": measurement_id, "lease_expired": expired, **values})


def link(conn: Connection, experiment_id: int, run_ids: list[int]) -> None:
    """Add the missing (experiment, run) memberships."""
    links = _LINKS
    for chunk in chunks(run_ids):
        linked = set(conn.scalars(select(links.c.run_id).where(
            links.c.experiment_id == experiment_id, links.c.run_id.in_(chunk))))
        new = [{"experiment_id": experiment_id, "run_id": i} for i in chunk if i not in linked]
        if new:
            conn.execute(_INSERT_LINKS, new)


def insert_children(conn: Connection, measurement_id: int, result: RunResult) -> None:
    if result.token_timings:
        _insert_token_timings(conn, measurement_id, result.token_timings)
    if result.snapshots:
        conn.execute(_INSERT_SNAPSHOTS, [
            {"measurement_id": measurement_id, "phase": s.phase, "taken_at": utc_naive(s.taken_at),
             "fingerprint": dict(s.fingerprint)}
            for s in result.snapshots
        ])
    if result.outcome is not None:
        values = asdict(result.outcome)
        values["extra"] = dict(values["extra"] or {})
        conn.execute(_INSERT_OUTCOME, {"measurement_id": measurement_id, **values})


TIMING_COLUMNS = ("measurement_id", "step", "token", "ms", "attn_ms")


def _insert_token_timings(conn: Connection, measurement_id: int,
                          timings: list[TokenTiming]) -> None:
    """One executemany for all decode steps: the bulk path that bench/store.py measures.

    On drivers with positional parameters (SQLite) the compiled INSERT goes straight to the
    driver with tuples, which skips SQLAlchemy's per-row dict processing (about 1.7x faster).
    Other drivers take Core's executemany (on PostgreSQL the per-run commit dominates anyway).
    """
    rows = [(measurement_id, t.step, t.token, t.ms, t.attn_ms) for t in timings]
    table = TokenTimingRow.__table__
    if conn.dialect.positional:
        sql = _positional_timings_sql(conn)
        if sql is not None:
            conn.exec_driver_sql(sql, rows)
            return
    conn.execute(insert(table), [dict(zip(TIMING_COLUMNS, row, strict=True)) for row in rows])


_TIMINGS_SQL: dict[tuple[type, str], str | None] = {}  # dialect -> the positional INSERT


def _positional_timings_sql(conn: Connection) -> str | None:
    """The token timings' INSERT in the dialect's positional form, when its parameters come in
    TIMING_COLUMNS' order (None otherwise)."""
    dialect = (type(conn.dialect), conn.dialect.paramstyle)
    if dialect not in _TIMINGS_SQL:
        compiled = insert(TokenTimingRow.__table__).compile(dialect=conn.dialect,
                                                            column_keys=list(TIMING_COLUMNS))
        _TIMINGS_SQL[dialect] = (str(compiled) if tuple(compiled.positiontup) == TIMING_COLUMNS
                                 else None)
    return _TIMINGS_SQL[dialect]
