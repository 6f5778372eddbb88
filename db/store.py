"""The result store: the coordinator's only way to write results, and the CLI's way to read them.

``Store.open(url)`` connects to any SQLAlchemy URL (SQLite by default, in WAL mode) and brings the
schema up to date with the Alembic migrations in ``db/migrations`` (see db/connection.py). Each run
is saved in ONE transaction (run row, snapshots, token timings, outcome), so a crash never leaves
half a run, and the unique run key guarantees at most one row per run.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, TypeVar

import pandas as pd
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, delete, event, insert, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from db import queries
from db.connection import create_store_engine, lost_database, migrate, retry_locked, writer
from db.errors import StoreError, StoreInputError
from db.jobs import Jobs
from db.leases import Leases
from db.models import (
    Build,
    Device,
    DeviceSnapshot,
    Experiment,
    ExperimentRun,
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
        event.listen(engine, "handle_error", lost_database(shown))
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

    # -- runs ----------------------------------------------------------------------------------

    def completed_run_keys(self, run_keys: Iterable[str] | None = None) -> set[str]:
        """Keys of the runs stored as ok (among ``run_keys`` when given)."""
        ok = select(Run.run_key).where(Run.status == "ok")
        with self.engine.connect() as conn:
            if run_keys is None:
                return set(conn.scalars(ok))
            done: set[str] = set()
            for chunk in _chunks(list(run_keys)):
                done.update(conn.scalars(ok.where(Run.run_key.in_(chunk))))
            return done

    @retry_locked
    def save_run(self, result: RunResult) -> int:
        """Store one run and all its rows in ONE transaction; returns the run id.

        A row with the same run key (failed, interrupted, pending, or ok under ``--force``) is
        replaced in place: it keeps its id, and its old snapshots, timings and outcome go.
        """
        _check_result(result)
        values = _run_values(result)
        runs = Run.__table__
        with self.writer.begin() as conn:
            run_id = conn.scalar(select(runs.c.id).where(runs.c.run_key == result.run_key))
            if run_id is None:
                run_id = conn.execute(insert(runs).values(**values)).inserted_primary_key[0]
                conn.execute(insert(ExperimentRun.__table__).values(
                    experiment_id=result.experiment_id, run_id=run_id))
            else:
                for child in (TokenTimingRow, OutcomeRow, DeviceSnapshot):
                    conn.execute(delete(child.__table__).where(child.__table__.c.run_id == run_id))
                conn.execute(update(runs).where(runs.c.id == run_id).values(**values))
                _link(conn, result.experiment_id, [run_id])
            _insert_children(conn, run_id, result)
        return run_id

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

    @retry_locked
    def mark_runs(self, keys: Iterable[str], status: str, error: str | None = None) -> set[str]:
        """Set ``status`` (e.g. interrupted, pending) and ``error`` on the stored, non-ok runs.

        Ok runs are never downgraded. Returns the keys that have no row at all: record those
        with ``save_run(RunResult(..., status=status))`` since a row needs its device etc.
        """
        if status not in RUN_STATUSES:
            raise ValueError(f"status {status!r}: allowed {', '.join(RUN_STATUSES)}")
        keys = list(dict.fromkeys(keys))
        runs = Run.__table__
        stored: set[str] = set()
        with self.writer.begin() as conn:
            for chunk in _chunks(keys):
                stored.update(conn.scalars(select(runs.c.run_key).where(runs.c.run_key.in_(chunk))))
                conn.execute(update(runs)
                             .where(runs.c.run_key.in_(chunk), runs.c.status != "ok")
                             .values(status=status, error=error))
        return set(keys) - stored

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

    def frames(self, experiment: str) -> dict[str, pd.DataFrame]:
        with self.engine.connect() as conn:
            return queries.frames(conn, experiment)


def _check_result(result: RunResult) -> None:
    if result.status not in RUN_STATUSES:
        raise ValueError(f"run {result.run_key}: status {result.status!r}; "
                         f"allowed {', '.join(RUN_STATUSES)}")
    for snapshot in result.snapshots:
        if snapshot.phase not in SNAPSHOT_PHASES:
            raise ValueError(f"run {result.run_key}: snapshot phase {snapshot.phase!r}; "
                             f"allowed {', '.join(SNAPSHOT_PHASES)}")


# A run's record and its row are one definition: every column of ``runs`` but its id comes
# from the RunResult field of the same name (tests/test_store.py holds the two together, so a
# column added to one and not the other fails there, and here at once).
RUN_TIMESTAMPS = ("started_at", "finished_at")
RUN_FIELDS = tuple(c.name for c in Run.__table__.columns if c.name != "id")


def _run_values(result: RunResult) -> dict[str, Any]:
    values = {name: getattr(result, name) for name in RUN_FIELDS}
    values["config"] = dict(result.config)
    for name in RUN_TIMESTAMPS:
        values[name] = utc_naive(values[name])
    return values


def _link(conn: Connection, experiment_id: int, run_ids: list[int]) -> None:
    """Add the missing (experiment, run) memberships."""
    links = ExperimentRun.__table__
    for chunk in _chunks(run_ids):
        linked = set(conn.scalars(select(links.c.run_id).where(
            links.c.experiment_id == experiment_id, links.c.run_id.in_(chunk))))
        new = [{"experiment_id": experiment_id, "run_id": i} for i in chunk if i not in linked]
        if new:
            conn.execute(insert(links), new)


def _insert_children(conn: Connection, run_id: int, result: RunResult) -> None:
    if result.token_timings:
        _insert_token_timings(conn, run_id, result.token_timings)
    if result.snapshots:
        conn.execute(insert(DeviceSnapshot.__table__), [
            {"run_id": run_id, "phase": s.phase, "taken_at": utc_naive(s.taken_at),
             "fingerprint": dict(s.fingerprint)}
            for s in result.snapshots
        ])
    if result.outcome is not None:
        values = asdict(result.outcome)
        values["extra"] = dict(values["extra"] or {})
        conn.execute(insert(OutcomeRow.__table__).values(run_id=run_id, **values))


TIMING_COLUMNS = ("run_id", "step", "token", "ms", "attn_ms")


def _insert_token_timings(conn: Connection, run_id: int, timings: list[TokenTiming]) -> None:
    """One executemany for all decode steps: the bulk path that bench/store.py measures.

    On drivers with positional parameters (SQLite) the compiled INSERT goes straight to the
    driver with tuples, which skips SQLAlchemy's per-row dict processing (about 1.7x faster).
    Other drivers take Core's executemany (on PostgreSQL the per-run commit dominates anyway).
    """
    rows = [(run_id, t.step, t.token, t.ms, t.attn_ms) for t in timings]
    table = TokenTimingRow.__table__
    if conn.dialect.positional:
        compiled = insert(table).compile(dialect=conn.dialect, column_keys=list(TIMING_COLUMNS))
        if tuple(compiled.positiontup) == TIMING_COLUMNS:
            conn.exec_driver_sql(str(compiled), rows)
            return
    conn.execute(insert(table), [dict(zip(TIMING_COLUMNS, row, strict=True)) for row in rows])
