"""The result store: the coordinator's only way to write results, and the CLI's way to read them.

``Store.open(url)`` connects to any SQLAlchemy URL (SQLite by default, in WAL mode) and brings the
schema up to date with the Alembic migrations in ``db/migrations`` (see db/connection.py). Each
measurement is saved in ONE transaction (its row, snapshots, token timings, outcome), so a crash
never leaves half of one; the unique run key keeps one ``runs`` row per run, and measurements
are appended to it, never overwritten.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import pandas as pd
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, func, insert, or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from db import queries
from db.connection import create_store_engine, migrate, retry_locked, writer
from db.errors import StoreError, StoreInputError
from db.jobs import Jobs
from db.leases import Leases
from db.measurements import CURRENT, Selection, counted_ok
from db.models import (
    Build,
    Device,
    DeviceSnapshot,
    Experiment,
    ExperimentRun,
    Lease,
    Measurement,
    Model,
    OutcomeRow,
    Run,
    TokenTimingRow,
    Workload,
)
from db.records import RUN_STATUSES, SNAPSHOT_PHASES, RunResult, TokenTiming

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


def _chunks(items: list[T]) -> Iterator[list[T]]:
    for start in range(0, len(items), KEY_CHUNK):
        yield items[start:start + KEY_CHUNK]


class Store:
    """The result store. Open with :meth:`open`; all methods are safe to call repeatedly."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.writer = writer(engine)  # write transactions (BEGIN IMMEDIATE on SQLite)
        self._sessions = sessionmaker(self.writer, expire_on_commit=False)
        self.leases = Leases(self.writer)
        self.jobs = Jobs(self.writer)

    @classmethod
    def open(cls, url: str, create: bool = True) -> Store:
        """Connect and bring the schema to the newest revision (see create_store_engine)."""
        engine = create_store_engine(url, create)
        shown = engine.url.render_as_string(hide_password=True)
        try:
            migrate(engine)
        except CommandError as exc:
            engine.dispose()
            raise StoreError(
                f"--db {shown}: the schema cannot be upgraded ({exc}); it was probably written "
                "by a newer benchfarm"
            ) from exc
        except SQLAlchemyError as exc:
            engine.dispose()
            reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
            raise StoreInputError(f"--db {shown}: cannot open the result store ({reason})") from exc
        return cls(engine)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """An ORM session in one transaction: committed on success, rolled back on error."""
        with self._sessions.begin() as session:
            yield session

    # -- reference rows ------------------------------------------------------------------------

    @retry_locked
    def upsert_experiment(self, name: str, spec_text: str, spec_hash: str) -> int:
        """The experiment named ``name``; its spec is updated to the one being run."""
        with self.session() as s:
            row = s.scalar(select(Experiment).where(Experiment.name == name))
            if row is None:
                row = Experiment(name=name, created_at=now())
                s.add(row)
            row.spec_text, row.spec_hash, row.updated_at = spec_text, spec_hash, now()
            s.flush()
            return row.id

    @retry_locked
    def upsert_device(self, name: str, arch: str, cls: str, emulated: bool,
                      info: dict[str, Any]) -> int:
        with self.session() as s:
            row = s.scalar(select(Device).where(Device.name == name))
            if row is None:
                row = Device(name=name)
                s.add(row)
            row.arch, row.cls, row.emulated = arch, cls, bool(emulated)
            row.info, row.updated_at = dict(info), now()
            s.flush()
            return row.id

    @retry_locked
    def record_build(self, record: dict[str, Any]) -> int:
        """Store a harness BuildRecord (as ``dataclasses.asdict``); one row per (sha256, target)."""
        with self.session() as s:
            row = s.scalar(select(Build).where(Build.binary_sha256 == record["binary_sha256"],
                                               Build.target == record["target"]))
            if row is None:
                row = Build(created_at=now())
                s.add(row)
            row.engine = str(record.get("engine", "lmc"))
            for column in ("target", "variant", "toolchain", "compiler", "compiler_version",
                           "source_hash", "revision", "binary", "binary_sha256"):
                setattr(row, column, str(record[column]))
            row.cflags, row.ldflags = list(record["cflags"]), list(record["ldflags"])
            row.build_key = record.get("build_key")
            row.build_seconds = record.get("build_seconds")
            row.extra = dict(record.get("extra") or {})
            s.flush()
            return row.id

    @retry_locked
    def upsert_model(self, path: str, sha256: str, config: dict[str, Any]) -> int:
        with self.session() as s:
            row = s.scalar(select(Model).where(Model.path == str(path), Model.sha256 == sha256))
            if row is None:
                row = Model(path=str(path), sha256=sha256)
                s.add(row)
            row.config = dict(config)
            s.flush()
            return row.id

    @retry_locked
    def upsert_workload(self, kind: str, params: dict[str, Any], content_hash: str,
                        ids: Iterable[int], answer: str | None = None,
                        needle_span: Iterable[int] | None = None) -> int:
        """The workload with ``content_hash``; its content never changes once stored."""
        with self.session() as s:
            row_id = s.scalar(select(Workload.id).where(Workload.content_hash == content_hash))
            if row_id is not None:
                return row_id
            row = Workload(kind=kind, params=dict(params), content_hash=content_hash,
                           ids=[int(i) for i in ids], answer=answer,
                           needle_span=None if needle_span is None else list(needle_span))
            s.add(row)
            s.flush()
            return row.id

    # -- runs and their measurements ----------------------------------------------------------

    def completed_run_keys(self, run_keys: Iterable[str] | None = None) -> set[str]:
        """Keys of the runs with an ok measurement made under a live lease (among ``run_keys``
        when given)."""
        ok = (select(Run.run_key).join(Measurement, Measurement.run_id == Run.id)
              .where(counted_ok()).distinct())
        with self.engine.connect() as conn:
            if run_keys is None:
                return set(conn.scalars(ok))
            done: set[str] = set()
            for chunk in _chunks(list(run_keys)):
                done.update(conn.scalars(ok.where(Run.run_key.in_(chunk))))
            return done

    @retry_locked
    def start_measurement(self, result: RunResult, measurement_id: int | None = None) -> int:
        """Record an attempt as it starts (status ``running``, under ``result.lease_id``,
        started now unless the result says when): a coordinator that dies with it in flight
        leaves it to be found ``lost`` (see mark_lost). Returns the measurement id, which
        ``save_run`` completes. ``measurement_id``: an open attempt of the run that never ran
        (its board was busy), started again in place instead of adding one."""
        start = replace(result, status="running", token_timings=[], outcome=None, snapshots=[],
                        started_at=result.started_at or now())
        with self.writer.begin() as conn:
            run_id = _ensure_run(conn, start)
            expired = _lease_expired(conn, start)
            if measurement_id is None:
                return _append(conn, run_id, start, expired)
            _complete(conn, run_id, measurement_id, start, expired)
            return measurement_id

    @retry_locked
    def save_run(self, result: RunResult, measurement_id: int | None = None) -> Saved:
        """Store one measurement of a run and all its rows in ONE transaction.

        Without ``measurement_id`` the measurement is appended (the run's row is made on its
        first one); with it, the attempt ``start_measurement`` recorded is completed (it must be
        ``running``, or ``lost`` when another coordinator gave it up meanwhile). Earlier
        measurements are never changed. A result whose lease had expired by now (another
        coordinator may have had the board and stored the run) is kept with ``lease_expired``
        and does not count as the run's ok.
        """
        _check_result(result)
        with self.writer.begin() as conn:
            run_id = _ensure_run(conn, result)
            expired = _lease_expired(conn, result)
            if measurement_id is None:
                measurement_id = _append(conn, run_id, result, expired)
            else:
                _complete(conn, run_id, measurement_id, result, expired)
            _insert_children(conn, measurement_id, result)
        return Saved(run_id, measurement_id, expired)

    @retry_locked
    def mark_lost(self) -> int:
        """Mark ``lost`` the attempts still ``running`` whose board lease is no longer live:
        their coordinator died or stalled past its lease (a coordinator calls this when it
        takes a board). Returns how many."""
        table = Measurement.__table__
        live = select(Lease.lease_id).where(Lease.expires >= now())
        with self.writer.begin() as conn:
            return conn.execute(update(table).where(
                table.c.status == "running",
                or_(table.c.lease_id.is_(None), table.c.lease_id.not_in(live))).values(
                status="lost", lease_expired=True, finished_at=now(),
                error="its coordinator stopped while it was in flight (the board's lease "
                      "expired)")).rowcount

    @retry_locked
    def link_runs(self, experiment_id: int, run_keys: Iterable[str]) -> set[str]:
        """Make the stored runs with these keys part of the experiment as well.

        For runs another experiment already completed (run keys do not name the experiment):
        the experiment's summary, frames and reports then include them. Returns the keys that
        have no row.
        """
        keys = list(dict.fromkeys(run_keys))
        runs = Run.__table__
        found: dict[str, int] = {}
        with self.writer.begin() as conn:
            for chunk in _chunks(keys):
                found.update(conn.execute(
                    select(runs.c.run_key, runs.c.id).where(runs.c.run_key.in_(chunk))).all())
            _link(conn, experiment_id, list(found.values()))
        return set(keys) - set(found)

    # -- queries (db/queries.py) ---------------------------------------------------------------

    def list_experiments(self) -> list[str]:
        with self.session() as s:
            return queries.list_experiments(s)

    def list_runs(self, experiment: str | None = None,
                  status: str | None = None) -> list[queries.RunListing]:
        with self.session() as s:
            return queries.list_runs(s, experiment, status)

    def run_durations(self) -> list[queries.RunDuration]:
        """The wall time of every stored ok run, with what identifies its kind of work."""
        with self.session() as s:
            return queries.run_durations(s)

    def get_run(self, run_id_or_key: int | str) -> queries.RunDetail:
        with self.session() as s:
            return queries.get_run(s, run_id_or_key)

    def experiment_summary(self, name: str) -> queries.ExperimentSummary:
        with self.session() as s:
            return queries.experiment_summary(s, name)

    def frames(self, experiment: str,
               selection: Selection | None = None) -> dict[str, pd.DataFrame]:
        """The experiment's rows; by default each run's current measurement (its latest ok
        one, else its latest), see db.measurements.Selection for all of them or a time window."""
        with self.engine.connect() as conn:
            return queries.frames(conn, experiment, selection or CURRENT)


def _check_result(result: RunResult) -> None:
    if result.status not in RUN_STATUSES:
        raise ValueError(f"run {result.run_key}: status {result.status!r}; "
                         f"allowed {', '.join(RUN_STATUSES)}")
    for snapshot in result.snapshots:
        if snapshot.phase not in SNAPSHOT_PHASES:
            raise ValueError(f"run {result.run_key}: snapshot phase {snapshot.phase!r}; "
                             f"allowed {', '.join(SNAPSHOT_PHASES)}")


# A run's record and its rows are one definition: every column of ``runs`` and
# ``measurements`` but the store's own (ids, the attempt number, the lease check) comes from the
# RunResult field of the same name (tests/test_store.py holds them together).
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


def _ensure_run(conn: Connection, result: RunResult) -> int:
    """The run's row (made from the result on its first measurement), linked to the result's
    experiment. A run's identity never changes once stored."""
    runs = Run.__table__
    run_id = conn.scalar(select(runs.c.id).where(runs.c.run_key == result.run_key))
    if run_id is None:
        values = {name: getattr(result, name) for name in RUN_FIELDS}
        values["config"] = dict(result.config)
        run_id = conn.execute(insert(runs).values(**values)).inserted_primary_key[0]
    _link(conn, result.experiment_id, [run_id])
    return run_id


def _lease_expired(conn: Connection, result: RunResult) -> bool:
    """Whether the lease the result was made under is no longer live (expired, released, or
    the board's lease passed to another coordinator)."""
    if result.lease_id is None:
        return False
    leases = Lease.__table__
    live = conn.scalar(select(leases.c.lease_id).where(leases.c.lease_id == result.lease_id,
                                                       leases.c.expires >= now()))
    return live is None


def _append(conn: Connection, run_id: int, result: RunResult, expired: bool) -> int:
    table = Measurement.__table__
    last = conn.scalar(select(func.max(table.c.attempt)).where(table.c.run_id == run_id))
    return conn.execute(insert(table).values(
        run_id=run_id, attempt=(last or 0) + 1, lease_expired=expired,
        **_measurement_values(result))).inserted_primary_key[0]


def _complete(conn: Connection, run_id: int, measurement_id: int, result: RunResult,
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


def _link(conn: Connection, experiment_id: int, run_ids: list[int]) -> None:
    """Add the missing (experiment, run) memberships."""
    links = ExperimentRun.__table__
    for chunk in _chunks(run_ids):
        linked = set(conn.scalars(select(links.c.run_id).where(
            links.c.experiment_id == experiment_id, links.c.run_id.in_(chunk))))
        new = [{"experiment_id": experiment_id, "run_id": i} for i in chunk if i not in linked]
        if new:
            conn.execute(insert(links), new)


def _insert_children(conn: Connection, measurement_id: int, result: RunResult) -> None:
    if result.token_timings:
        _insert_token_timings(conn, measurement_id, result.token_timings)
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
        compiled = insert(table).compile(dialect=conn.dialect, column_keys=list(TIMING_COLUMNS))
        if tuple(compiled.positiontup) == TIMING_COLUMNS:
            conn.exec_driver_sql(str(compiled), rows)
            return
    conn.execute(insert(table), [dict(zip(TIMING_COLUMNS, row, strict=True)) for row in rows])
