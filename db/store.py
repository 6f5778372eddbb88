"""The result store: the coordinator's only way to write results, and the CLI's way to read them.

``Store.open(url)`` connects to any SQLAlchemy URL (SQLite by default, in WAL mode) and brings the
schema up to date with the Alembic migrations in ``db/migrations`` (see db/connection.py). Each
measurement is saved in ONE transaction (its row, snapshots, token timings, outcome), so a crash
never leaves half of one; the unique run key keeps one ``runs`` row per run, and measurements
are appended to it, never overwritten.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, bindparam, event, insert, or_, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from db import experiments, frames, limits, queries, revisions
from db.alerts import Alerts
from db.audit import Audit
from db.boards import Boards
from db.connection import (
    BUSY_TIMEOUT_S,
    SchemaUnknown,
    connect_database,
    lost_database,
    migrate,
    retry_locked,
    writer,
)
from db.errors import StoreError, StoreInputError
from db.jobs import Jobs
from db.leases import Leases
from db.measurements import CURRENT, Selection, counted_ok
from db.models import (
    Build,
    Device,
    Experiment,
    Lease,
    Measurement,
    Model,
    Run,
    StepResult,
    Workload,
)
from db.records import RUN_STATUSES, SNAPSHOT_PHASES, RunResult
from db.rows import (
    Saved,
    add_counts,
    append,
    chunks,
    complete,
    ensure_run,
    insert_children,
    lease_expired,
    link,
    now,
    open_attempt,
    refresh_runs,
)
from db.users import Users

if TYPE_CHECKING:
    import pandas as pd

# Attempts still running whose lease is no longer live (see Store.mark_lost); built once, since
# every take of a board runs it.
_MEASURED = Measurement.__table__
_STALE = (_MEASURED.c.status == "running") & or_(
    _MEASURED.c.lease_id.is_(None), _MEASURED.c.lease_id.not_in(
        select(Lease.lease_id).where(Lease.expires >= bindparam("p_now"))))
_STALE_ATTEMPTS = select(_MEASURED.c.id, _MEASURED.c.run_id).where(_STALE)
_MARK_LOST = update(_MEASURED).where(
    _MEASURED.c.id.in_(bindparam("p_ids", expanding=True)), _STALE).values(
    status="lost", lease_expired=True, finished_at=bindparam("p_now"),
    error="its coordinator stopped while it was in flight (the board's lease expired)")
# Whether one run is done (``completed_run_keys`` of one key: asked before each dispatch).
_COMPLETED = (select(Run.id).join(Measurement, Measurement.id == Run.current_measurement_id)
              .where(Run.run_key == bindparam("p_run_key"), counted_ok()))


class Store:
    """The result store. Open with :meth:`open`; all methods are safe to call repeatedly."""

    def __init__(self, database: Engine, read_only: bool = False) -> None:
        """``read_only``: for a process that only reads (`benchfarm web`, `status`, `runs`,
        `logs` ...): its transactions stay deferred, so on SQLite (WAL) it neither waits for a
        coordinator's write lock nor takes the one coordinators wait for."""
        self.database = database
        # write transactions (BEGIN IMMEDIATE on SQLite)
        self.writer = database if read_only else writer(database)
        self._sessions = sessionmaker(self.writer, expire_on_commit=False)
        self.leases = Leases(self.writer)
        self.jobs = Jobs(self.writer)
        self.boards = Boards(self.writer)
        self.users = Users(self.writer)
        self.audit = Audit(self.writer)
        self.alerts = Alerts(self.writer)

    @classmethod
    def open(cls, url: str, create: bool = True, read_only: bool = False) -> Store:
        """Connect and bring the schema to the newest revision (see connect_database);
        ``read_only`` as for the constructor."""
        database = connect_database(url, create)
        shown = database.url.render_as_string(hide_password=True)
        try:
            migrate(database)
        except SchemaUnknown as exc:
            database.dispose()
            raise StoreError(
                f"--db {shown}: the schema cannot be upgraded ({exc}); it was probably written "
                "by a newer benchfarm"
            ) from exc
        except SQLAlchemyError as exc:
            database.dispose()
            reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
            raise StoreInputError(f"--db {shown}: cannot open the result store ({reason})") from exc
        event.listen(database, "handle_error", lost_database(shown))
        return cls(database, read_only)

    def close(self) -> None:
        self.database.dispose()

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
            add_counts(s.connection(), row.id)
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
            row.isa = record.get("isa") or None
            row.build_seconds = record.get("build_seconds")
            row.extra = dict(record.get("extra") or {})
            s.flush()
            revisions.name_build(s, row.id, row.revision)
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
        if isinstance(run_keys, list | tuple) and len(run_keys) == 1:  # before each dispatch
            with self.database.connect() as conn:
                return {run_keys[0]} if self.run_done(conn, run_keys[0]) else set()
        ok = (select(Run.run_key).join(Measurement, Measurement.id == Run.current_measurement_id)
              .where(counted_ok()))
        with self.database.connect() as conn:
            if run_keys is None:
                return set(conn.scalars(ok))
            done: set[str] = set()
            for chunk in chunks(list(run_keys)):
                done.update(conn.scalars(ok.where(Run.run_key.in_(chunk))))
            return done

    @retry_locked
    def start_measurement(self, result: RunResult, measurement_id: int | None = None) -> int:
        """Record an attempt as it starts (status ``running``, under ``result.lease_id``,
        started now unless the result says when): a coordinator that dies with it in flight
        leaves it to be found ``lost`` (see mark_lost). Returns the measurement id, which
        ``save_run`` completes. ``measurement_id``: an open attempt of the run that never ran
        (its board was busy), started again in place instead of adding one."""
        with self.writer.begin() as conn:
            return self.start_measurement_on(conn, result, measurement_id)

    @staticmethod
    def start_measurement_on(conn: Connection, result: RunResult,
                             measurement_id: int | None = None) -> int:
        """``start_measurement`` on the caller's connection, inside its transaction (the
        scheduler's: the one that grants the board's lease)."""
        start = replace(result, status="running", token_timings=[], outcome=None, snapshots=[],
                        started_at=result.started_at or now())
        if measurement_id is None:
            run = ensure_run(conn, start)
            run_id = run.id
            measurement_id = append(conn, run, start, lease_expired(conn, start))
        else:
            run_id, expired = open_attempt(conn, start, measurement_id)
            complete(conn, measurement_id, start, expired)
        refresh_runs(conn, [run_id])
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
            if measurement_id is None:
                run = ensure_run(conn, result)
                run_id, expired = run.id, lease_expired(conn, result)
                measurement_id = append(conn, run, result, expired)
            else:
                run_id, expired = open_attempt(conn, result, measurement_id)
                complete(conn, measurement_id, result, expired)
            insert_children(conn, measurement_id, result)
            refresh_runs(conn, [run_id])
        return Saved(run_id, measurement_id, expired)

    @retry_locked
    def save_runs(self, results: list[RunResult]) -> list[Saved]:
        """Append a measurement for each result, all in ONE transaction (a bulk import, or a
        store grown for a benchmark): each as ``save_run`` without ``measurement_id`` would
        store it, the runs' kept columns and counts brought up to date once at the end."""
        for result in results:
            _check_result(result)
        saved = []
        with self.writer.begin() as conn:
            for result in results:
                run = ensure_run(conn, result)
                expired = lease_expired(conn, result)
                measurement_id = append(conn, run, result, expired)
                insert_children(conn, measurement_id, result)
                saved.append(Saved(run.id, measurement_id, expired))
            refresh_runs(conn, [s.run_id for s in saved])
        return saved

    @retry_locked
    def mark_lost(self) -> int:
        """Mark ``lost`` the attempts still ``running`` whose board lease is no longer live:
        their coordinator died or stalled past its lease (a coordinator does this when it
        takes a board, in the transaction that grants the lease: ``sweep_lost``). Returns how
        many."""
        with self.writer.begin() as conn:
            return self.sweep_lost(conn)

    @staticmethod
    def run_done(conn: Connection, run_key: str) -> bool:
        """Whether the run is in ``completed_run_keys``, on the caller's connection."""
        return conn.scalar(_COMPLETED, {"p_run_key": run_key}) is not None

    @staticmethod
    def sweep_lost(conn: Connection) -> int:
        """``mark_lost`` on the caller's connection, inside its transaction."""
        moment = now()
        found = conn.execute(_STALE_ATTEMPTS, {"p_now": moment}).all()
        for chunk in chunks([measurement for measurement, _ in found]):
            conn.execute(_MARK_LOST, {"p_now": moment, "p_ids": chunk})
        refresh_runs(conn, [run_id for _, run_id in found])
        return len(found)

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
            for chunk in chunks(keys):
                found.update(conn.execute(
                    select(runs.c.run_key, runs.c.id).where(runs.c.run_key.in_(chunk))).all())
            link(conn, experiment_id, list(found.values()))
        return set(keys) - set(found)

    # -- what is derived from the runs and kept -------------------------------------------------

    def known_steps(self, keys: Collection[str]) -> dict[str, list[Any]]:
        """The steps kept for these series keys (those kept; see models.StepResult)."""
        found: dict[str, list[Any]] = {}
        table = StepResult.__table__
        with self.database.connect() as conn:
            for chunk in chunks(sorted(set(keys))):
                found.update(conn.execute(select(table.c.key, table.c.steps)
                                          .where(table.c.key.in_(chunk))).all())
        return found

    @retry_locked
    def keep_steps(self, found: dict[str, list[Any]]) -> None:
        """Keep steps found in series (by their keys); a key already kept stays as it is (the
        same key is the same series, so the same steps)."""
        if not found:
            return
        table = StepResult.__table__
        try:
            with self.writer.begin() as conn:
                have: set[str] = set()
                for chunk in chunks(sorted(found)):
                    have.update(conn.scalars(select(table.c.key).where(table.c.key.in_(chunk))))
                rows = [{"key": key, "steps": steps, "computed_at": now()}
                        for key, steps in found.items() if key not in have]
                if rows:
                    conn.execute(insert(table), rows)
        except IntegrityError:
            pass  # another process kept the same series meanwhile: the same steps

    # -- reads (db/queries.py, db/experiments.py, db/frames.py) -------------------------------

    def list_experiments(self) -> list[str]:
        with self.session() as s:
            return queries.list_experiments(s)

    def experiment_lines(self, limit: int | None = None, offset: int = 0,
                         newest_first: bool = False) -> list[queries.ExperimentLine]:
        """The experiments in name order (or the most recently run first) with their runs per
        status (``limit`` of them from ``offset`` on)."""
        with self.session() as s:
            return queries.experiment_lines(s, limit, offset, newest_first)

    def count_experiments(self) -> int:
        with self.session() as s:
            return queries.count_experiments(s)

    def list_runs(self, experiment: str | None = None, status: str | None = None,
                  limit: int | None = None, offset: int = 0) -> list[queries.RunListing]:
        """The runs (of ``experiment``, with ``status``) in id order: ``limit`` of them from
        ``offset`` on (all when ``limit`` is None)."""
        with self.session() as s:
            return queries.list_runs(s, experiment, status, limit, offset)

    def count_runs(self, experiment: str | None = None, status: str | None = None) -> int:
        """How many runs ``list_runs`` has for these filters without a limit."""
        with self.session() as s:
            return queries.count_runs(s, experiment, status)

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

    def experiment_spec(self, name: str) -> experiments.StoredSpec:
        with self.session() as s:
            return experiments.spec(s, name)

    def experiment_mark(self, name: str) -> tuple[Any, ...]:
        """A value that changes when the experiment gets a new attempt or run, or an attempt
        of it ends (a cache key)."""
        with self.session() as s:
            return experiments.mark(s, name)

    def policy_groups(self, name: str, policy: str) -> tuple[int, list[queries.GroupSummary]]:
        """The experiment's writes and its ok runs of ``policy`` in groups
        (db.experiments.policy_groups)."""
        with self.session() as s:
            return experiments.policy_groups(s, name, policy)

    @retry_locked
    def keep_baseline(self, name: str, writes: int, failures: str) -> None:
        """Keep the experiment's baseline failures ("" for none) as found at ``writes``
        (``policy_groups``'s): `status` lists them while no run lands. A value found at
        fewer writes never replaces one found at more."""
        with self.writer.begin() as conn:
            conn.execute(_baseline_update(name, writes, failures))

    def keep_baseline_unless_busy(self, name: str, writes: int, failures: str) -> bool:
        """``keep_baseline`` for a read command: one attempt that never waits for SQLite's
        write lock and gives up on a store this user may not write (a read-only role), so a
        read is never held up or failed by what it only caches; True when kept."""
        try:
            with self.writer.connect() as conn:
                sqlite = conn.dialect.name == "sqlite"
                if sqlite:
                    conn.connection.driver_connection.execute("PRAGMA busy_timeout = 0")
                try:
                    with conn.begin():
                        conn.execute(_baseline_update(name, writes, failures))
                finally:
                    if sqlite:
                        conn.connection.driver_connection.execute(
                            f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        except (SQLAlchemyError, StoreError):
            return False
        return True

    def experiments_holding(self, run_keys: Collection[str]) -> list[str]:
        with self.session() as s:
            return experiments.holding(s, run_keys)

    def experiments_measuring(self, names: Collection[str]) -> list[str]:
        """The experiments holding runs of these boards, classes, engines or revisions
        (db.experiments.measuring)."""
        with self.session() as s:
            return experiments.measuring(s, names)

    def boards_among(self, names: Collection[str]) -> set[str]:
        """Those of ``names`` that name a device or a device class."""
        with self.session() as s:
            return experiments.boards_among(s, names)

    def builds_named(self, names: Collection[str]) -> dict[str, str]:
        """name -> the revision its build's row carries, for each of ``names`` some build
        was registered under (db.revisions.builds_named)."""
        with self.database.connect() as conn:
            return revisions.builds_named(conn, names)

    def model_configs(self, sha256s: Collection[str]) -> dict[str, dict[str, Any]]:
        """model sha256 -> its config.json as stored."""
        with self.database.connect() as conn:
            return {sha: config for batch in chunks(sorted(set(sha256s)))
                    for sha, config in conn.execute(select(Model.sha256, Model.config)
                                                    .where(Model.sha256.in_(batch)))}

    def board_limits(self, boards: Collection[str]) -> dict[str, dict[str, Any]]:
        """board -> its measured physical limits (db.limits.board_limits)."""
        with self.database.connect() as conn:
            return limits.board_limits(conn, boards)

    def history_frame(self, experiment: str) -> pd.DataFrame:
        """What a history across revisions reads of the experiment (db.frames.history_frame)."""
        with self.database.connect() as conn:
            return frames.history_frame(conn, experiment)

    def frames(self, experiment: str, selection: Selection | None = None,
               summaries: bool = False,
               boards: Collection[str] | None = None) -> dict[str, pd.DataFrame]:
        """The experiment's rows; by default each run's current measurement (its latest ok
        one, else its latest), see db.measurements.Selection for all of them or a time window.
        ``summaries``: the snapshots' summaries as documents instead of their fingerprints as
        JSON text; ``boards``: only the measurements made on these devices (names or
        classes)."""
        with self.database.connect() as conn:
            return frames.frames(conn, experiment, selection or CURRENT, summaries, boards)

    def snapshot_fingerprints(self, ids: Collection[int]) -> dict[int, Any]:
        """The fingerprint documents of these snapshots, by snapshot id."""
        with self.database.connect() as conn:
            return frames.snapshot_fingerprints(conn, ids)


def _check_result(result: RunResult) -> None:
    if result.status not in RUN_STATUSES:
        raise ValueError(f"run {result.run_key}: status {result.status!r}; "
                         f"allowed {', '.join(RUN_STATUSES)}")
    for snapshot in result.snapshots:
        if snapshot.phase not in SNAPSHOT_PHASES:
            raise ValueError(f"run {result.run_key}: snapshot phase {snapshot.phase!r}; "
                             f"allowed {', '.join(SNAPSHOT_PHASES)}")


def _baseline_update(name: str, writes: int, failures: str) -> Any:
    """The experiment's kept baseline verdict, unless one found at more writes is kept."""
    table = Experiment.__table__
    return (update(table).where(
        table.c.name == name,
        or_(table.c.baseline_writes.is_(None), table.c.baseline_writes <= writes))
        .values(baseline=failures, baseline_writes=writes))
