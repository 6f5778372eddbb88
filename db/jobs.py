"""The job queue: experiments submitted for `benchfarm serve`, and one-shot `benchfarm run`s.

A job is ``queued`` until a coordinator claims it (``running``, with the coordinator as its
``holder``), then ``done``, ``failed`` or ``cancelled``. The holder heartbeats while it runs the
job; a queued job whose holder stopped heartbeating (a SIGKILLed `serve`) is claimed again by
the next `serve`, and the runs it already stored as ok are skipped, so nothing runs twice. A
one-shot run (kind ``run``) whose coordinator vanished is marked failed instead: nobody would
otherwise know to finish it. ``cancel`` marks a job cancelled (and who did it); its holder sees
it at its next heartbeat and stops.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, case, func, insert, select, update

from db import job_events
from db.audit import AuditEvent, write
from db.connection import retry_locked
from db.errors import StoreInputError
from db.leases import utcnow
from db.models import (
    JOB_STATES,
    Device,
    Job,
    Lease,
    Measurement,
    Run,
)

ACTIVE = ("queued", "running")
MAX_ROW_ID = 2**63 - 1
MAX_NAME_CHARS = 200  # an owner (the column's size)
MAX_MESSAGE_CHARS = 4000  # a job's message: the outcome line or the error, cut to this
FINISHED_STATES = tuple(state for state in JOB_STATES if state not in ACTIVE)
STALE = "its coordinator stopped heartbeating"  # the cause of a dead coordinator's requeue


@dataclass(frozen=True)
class JobInfo:
    id: int
    experiment: str
    spec_path: str
    spec_text: str
    devices: list[Any] | None
    force: bool
    kind: str
    priority: int
    owner: str
    state: str
    holder: str | None
    heartbeat: datetime | None
    totals: dict[str, Any] | None
    message: str | None
    submitted_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    notify: dict[str, Any] | None
    cancelled_by: str | None


@dataclass(frozen=True)
class PlacementProgress:
    """One placement (a board, or a class pooling boards) of a running experiment."""

    placement: str
    total: int  # runs of the matrix placed here
    done: int  # stored ok
    failed: int
    running: int  # boards of the placement leased for this experiment now
    pending: int  # the rest: not run yet, or interrupted / cancelled / pending rows
    # the placement's stored runs per status (their current attempt), as `benchfarm status`
    # counts an experiment's runs; and the runs of the matrix not stored yet
    stored: dict[str, int] = field(default_factory=dict)
    not_started: int = 0

    def line(self, statuses: tuple[str, ...]) -> list[object]:
        """Placement, runs in the matrix, stored runs per status, not started."""
        return [self.placement, self.total, *(self.stored.get(s, 0) for s in statuses),
                self.not_started]


class Jobs:
    """The ``jobs`` table; ``database`` should open write transactions with BEGIN IMMEDIATE."""

    def __init__(self, database: Engine) -> None:
        self.database = database
        self.table = Job.__table__

    @retry_locked
    def add(self, experiment: str, spec_path: str, spec_text: str, *, owner: str,
            devices: list[str] | None = None, force: bool = False, priority: int = 0,
            holder: str | None = None, notify: dict[str, str] | None = None,
            event: AuditEvent | None = None) -> int:
        """A queued job, or with ``holder`` a one-shot run that this holder starts now;
        ``event`` (its target: the new job) is recorded with it."""
        if len(owner) > MAX_NAME_CHARS:
            raise StoreInputError(f"the owner: {len(owner)} characters; at most "
                                  f"{MAX_NAME_CHARS}")
        moment = utcnow()
        values: dict[str, Any] = {
            "experiment": experiment, "spec_path": spec_path, "spec_text": spec_text,
            "devices": devices, "force": force, "priority": priority, "owner": owner,
            "kind": "queue", "state": "queued", "submitted_at": moment, "notify": notify}
        if holder is not None:
            values |= {"kind": "run", "state": "running", "holder": holder,
                       "heartbeat": moment, "started_at": moment}
        with self.database.begin() as conn:
            job_id = conn.execute(insert(self.table).values(**values)).inserted_primary_key[0]
            write(conn, event and event.on(f"job {job_id}"), moment)
            job_events.record(conn, job_id, "submitted", moment, owner,
                              f"priority {priority}" + (f", devices {', '.join(devices)}"
                                                        if devices else ""))
            if holder is not None:
                job_events.record(conn, job_id, "claimed", moment, holder,
                                  "`benchfarm run` runs it at once")
            return job_id

    @retry_locked
    def claim_next(self, holder: str, stale_after_s: float,
                   waits: Callable[[Any, JobInfo], str | None] | None = None) -> JobInfo | None:
        """Reclaim jobs of dead holders, then take the queued job of highest priority that
        can start: all in ONE write transaction, so that a board freed a moment ago (a
        release, an end of maintenance) goes to the best job that waited for it, whichever
        `serve` looks first. ``waits(conn, job)`` says why a job cannot start now (None: it
        can), reading the store on the transaction's connection; a waiting job's message and
        events say why."""
        table = self.table
        with self.database.begin() as conn:
            moment = utcnow()  # once the write lock is held: claims are stamped in their order
            self._reap(conn, moment, stale_after_s)
            queued = conn.execute(select(table).where(table.c.state == "queued")
                                  .order_by(table.c.priority.desc(), table.c.id)).all()
            for row in queued:
                job = JobInfo(**row._mapping)
                why = waits(conn, job) if waits is not None else None
                if why:
                    self._note(conn, job, f"waiting: {why}", moment)
                    continue
                if not conn.execute(update(table).where(
                        table.c.id == job.id, table.c.state == "queued").values(
                        state="running", holder=holder, heartbeat=moment, started_at=moment,
                        message=None)).rowcount:
                    continue  # another serve took it (a store without serialised writers)
                job_events.record(conn, job.id, self._claim_event(conn, job.id), moment,
                                  holder, f"priority {job.priority}, the best queued job that "
                                          "can start")
                return self.get_on(conn, job.id)
        return None

    @retry_locked
    def step_aside(self, job_id: int, holder: str,
                   waits: Callable[[Any, JobInfo], str | None],
                   wanting: Callable[[JobInfo], str | None]) -> str | None:
        """Return the running job ``holder`` serves to the queue when a queued job of higher
        priority can start (``waits``, as in claim_next) and wants a board it waits for
        (``wanting(job)``: that board, or None): decided and done in ONE write transaction,
        so that the board goes to the better job once freed, whichever job's serve looks.
        Returns why it stepped aside (its ``requeued`` event's cause), or None: it goes on."""
        table = self.table
        with self.database.begin() as conn:
            moment = utcnow()
            mine = conn.execute(select(table.c.priority).where(
                table.c.id == job_id, table.c.state == "running",
                table.c.holder == holder)).first()
            if mine is None:
                return None  # cancelled, or no longer this serve's: its coordinator sees that
            better = conn.execute(select(table).where(table.c.state == "queued",
                                                      table.c.priority > mine.priority)
                                  .order_by(table.c.priority.desc(), table.c.id)).all()
            for row in better:
                job = JobInfo(**row._mapping)
                board = wanting(job)
                if board is None or waits(conn, job):
                    continue
                why = (f"stepped aside: job {job.id} (priority {job.priority}) goes first on "
                       f"board {board!r}, which this job (priority {mine.priority}) waits for")
                moved = conn.execute(update(table).where(
                    table.c.id == job_id, table.c.state == "running",
                    table.c.holder == holder).values(
                    state="queued", holder=None, message=f"requeued: {why}"[:MAX_MESSAGE_CHARS]))
                if moved.rowcount != 1:
                    return None  # cancelled or taken over meanwhile (PostgreSQL, no lock held)
                job_events.record(conn, job_id, "requeued", moment, holder, why)
                return why
        return None

    @staticmethod
    def _claim_event(conn: Any, job_id: int) -> str:
        """``taken over`` when the job's last coordinator died with it, else ``claimed``."""
        last = job_events.last_event(conn, job_id)
        died = last is not None and last.event == "requeued" and (last.cause or "").startswith(
            STALE)
        return "taken over" if died else "claimed"

    @retry_locked
    def reap(self, stale_after_s: float) -> None:
        """End what dead coordinators left running: a queued job whose holder stopped
        heartbeating ``stale_after_s`` ago goes back to the queue, a one-shot run's is failed
        as lost (`wait` calls this, so that it ends without a `serve`)."""
        with self.database.begin() as conn:
            self._reap(conn, utcnow(), stale_after_s)

    def _reap(self, conn: Any, moment: datetime, stale_after_s: float) -> None:
        table = self.table
        stale = table.c.heartbeat < moment - timedelta(seconds=stale_after_s)
        running = (table.c.state == "running") & stale
        dead = conn.execute(select(table.c.id, table.c.kind, table.c.holder)
                            .where(running)).all()
        if not dead:
            return
        conn.execute(update(table).where(running, table.c.kind == "queue").values(
            state="queued", holder=None,
            message="requeued: its coordinator stopped heartbeating"))
        conn.execute(update(table).where(running, table.c.kind == "run").values(
            state="failed", finished_at=moment,
            message="lost: its `benchfarm run` coordinator stopped heartbeating (killed?)"))
        for job_id, kind, holder in dead:
            cause = f"{STALE} for {stale_after_s:g} s (killed, or its host lost)"
            job_events.record(conn, job_id, "requeued" if kind == "queue" else "lost", moment,
                              holder, cause)

    @retry_locked
    def heartbeat(self, job_id: int) -> str:
        """Renew the job's heartbeat; returns its state (``cancelled`` means: stop)."""
        with self.database.begin() as conn:
            conn.execute(update(self.table).where(self.table.c.id == job_id)
                         .values(heartbeat=utcnow()))
            return conn.scalar(select(self.table.c.state).where(self.table.c.id == job_id))

    @retry_locked
    def set_totals(self, job_id: int, totals: dict[str, int]) -> None:
        """The runs the job was given, per placement: set once, at its first start (a resumed
        job plans only what is left of them; its total stays what it was given)."""
        with self.database.begin() as conn:
            conn.execute(update(self.table).where(self.table.c.id == job_id,
                                                  self.table.c.totals.is_(None))
                         .values(totals=dict(totals)))

    @retry_locked
    def finish(self, job_id: int, state: str, message: str, event: str = "finished") -> None:
        """End a running job (a cancelled one stays cancelled; the message is kept), recording
        ``event`` (``interrupted``: its coordinator was stopped by a signal)."""
        if state not in JOB_STATES:
            raise ValueError(f"job state {state!r}: allowed {', '.join(JOB_STATES)}")
        table, moment = self.table, utcnow()
        with self.database.begin() as conn:
            conn.execute(update(table).where(table.c.id == job_id)
                         .values(message=message[:MAX_MESSAGE_CHARS]))
            holder = conn.scalar(select(table.c.holder).where(table.c.id == job_id))
            if conn.execute(update(table).where(table.c.id == job_id, table.c.state == "running")
                            .values(state=state, finished_at=moment)).rowcount:
                job_events.record(conn, job_id, event, moment, holder, f"{state}: {message}")

    @retry_locked
    def requeue(self, job_id: int, message: str, event: str = "requeued") -> None:
        """Put a running job back in the queue (its coordinator stopped: ``interrupted``; its
        boards stopped taking work: ``drained``; a restart resumes), recording ``event``."""
        table, moment = self.table, utcnow()
        with self.database.begin() as conn:
            holder = conn.scalar(select(table.c.holder).where(table.c.id == job_id))
            if conn.execute(update(table).where(table.c.id == job_id,
                                                table.c.state == "running")
                            .values(state="queued", holder=None,
                                    message=message[:MAX_MESSAGE_CHARS])).rowcount:
                job_events.record(conn, job_id, event, moment, holder, message)

    def _note(self, conn: Any, job: JobInfo, message: str, moment: datetime) -> None:
        """Say on a queued job why it waits (shown by `benchfarm queue`); a ``waiting`` event
        when the reason changed."""
        message = message[:MAX_MESSAGE_CHARS]
        if job.message == message:
            return
        conn.execute(update(self.table).where(self.table.c.id == job.id,
                                              self.table.c.state == "queued")
                     .values(message=message))
        job_events.record(conn, job.id, "waiting", moment, None, message)

    @retry_locked
    def cancel(self, job_id: int, by: str, message: str,
               event: AuditEvent | None = None) -> bool:
        """Cancel a queued or running job, recording who did it (and ``event``, when it was
        still active); False if it had ended."""
        table, moment = self.table, utcnow()
        with self.database.begin() as conn:
            was = conn.scalar(select(table.c.state).where(table.c.id == job_id))
            cancelled = conn.execute(update(table).where(
                table.c.id == job_id, table.c.state.in_(ACTIVE)).values(
                state="cancelled", finished_at=moment, message=message[:MAX_MESSAGE_CHARS],
                cancelled_by=by)).rowcount == 1
            if cancelled:
                write(conn, event, moment)
                job_events.record(conn, job_id, "cancelled", moment, by,
                                  f"{message} (it was {was})")
            return cancelled

    def get(self, job_id: int) -> JobInfo:
        """The job with this id (StoreInputError naming `benchfarm queue` when none)."""
        if not 0 < job_id <= MAX_ROW_ID:  # the store's ids are 64-bit: no such job
            raise StoreInputError(f"no job {job_id}; job ids are from 1 to {MAX_ROW_ID}")
        with self.database.connect() as conn:
            return self.get_on(conn, job_id)

    def get_on(self, conn: Any, job_id: int) -> JobInfo:
        """``get`` on the caller's connection."""
        row = conn.execute(select(self.table).where(self.table.c.id == job_id)).first()
        if row is None:
            raise StoreInputError(f"no job {job_id}; `benchfarm queue --all` lists them")
        return JobInfo(**row._mapping)

    def events(self, job_id: int) -> list[job_events.JobEventInfo]:
        """The job's story, in order (db.job_events)."""
        return job_events.events(self.database, job_id)

    def attempts(self, job_id: int) -> list[job_events.JobAttempt]:
        """The attempts its coordinators made at its runs, in the order they started."""
        return job_events.attempts(self.database, job_id)

    def attempt_counts(self, job_id: int) -> dict[str, int]:
        return job_events.attempt_counts(self.database, job_id)

    def active(self, experiment: str) -> list[JobInfo]:
        """The queued and running jobs of ``experiment``."""
        return [j for j in self.list(ACTIVE) if j.experiment == experiment]

    def _queue_order(self) -> list[Any]:
        """Running first (oldest first), then queued by priority (then oldest first), then the
        rest, newest first."""
        c = self.table.c
        active = c.state.in_(ACTIVE)
        return [case((c.state == "running", 0), (c.state == "queued", 1), else_=2),
                case((c.state == "queued", -c.priority), else_=0),
                case((active, c.id), else_=-c.id)]

    def list(self, states: tuple[str, ...] | None = None, limit: int | None = None,
             offset: int = 0) -> list[JobInfo]:
        """Jobs in queue order (``_queue_order``), ``limit`` of them from ``offset`` on."""
        query = select(self.table).order_by(*self._queue_order()).offset(offset)
        if states:
            query = query.where(self.table.c.state.in_(states))
        if limit is not None:
            query = query.limit(limit)
        with self.database.connect() as conn:
            return [JobInfo(**row._mapping) for row in conn.execute(query)]

    def count(self, states: tuple[str, ...] | None = None) -> int:
        query = select(func.count()).select_from(self.table)
        if states:
            query = query.where(self.table.c.state.in_(states))
        with self.database.connect() as conn:
            return int(conn.scalar(query))

    def latest(self, experiment: str) -> JobInfo | None:
        """The newest job of ``experiment`` (running ones first)."""
        query = (select(self.table).where(self.table.c.experiment == experiment)
                 .order_by(*self._queue_order()).limit(1))
        with self.database.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else JobInfo(**row._mapping)

    def finished_since(self, job_id: int, since: datetime) -> int:
        """The job's attempts that ended (ok or failed) since ``since``: its pace."""
        with self.database.connect() as conn:
            return conn.scalar(
                select(func.count()).select_from(Measurement)
                .where(Measurement.job_id == job_id, Measurement.finished_at >= since,
                       Measurement.status.in_(("ok", "failed")))) or 0

    def progress(self, experiment: str, job: JobInfo | None = None) -> list[PlacementProgress]:
        """Per placement of the experiment's newest job (or of ``job``, read already): total /
        done / failed / running / pending; empty when no job recorded its totals. A job counts
        its own runs only (those its coordinators attempted, each once: its latest attempt),
        so a rerun or an extension of an experiment is not credited with earlier jobs' runs
        and done + failed never exceeds its total."""
        job = job or self.latest(experiment)
        if job is None or not job.totals:
            return []
        with self.database.connect() as conn:
            attempts = conn.execute(
                select(Measurement.run_id, Run.config, Measurement.status, Device.name)
                .join(Run, Run.id == Measurement.run_id)
                .join(Device, Device.id == Measurement.device_id)
                .where(Measurement.job_id == job.id).order_by(Measurement.id)).all()
            leased = conn.execute(
                select(Lease.board, Device.cls).outerjoin(Device, Device.name == Lease.board)
                .where(Lease.experiment == experiment, Lease.run_key.is_not(None),
                       Lease.expires >= utcnow())).all() if job.state == "running" else []
        latest = {run_id: ((config or {}).get("placement", device), status)
                  for run_id, config, status, device in attempts}
        counts: Counter[tuple[str, str]] = Counter(latest.values())
        result = []
        for placement, total in sorted(job.totals.items()):
            done, failed = counts[(placement, "ok")], counts[(placement, "failed")]
            running = sum(1 for board, cls in leased if placement in (board, cls))
            stored = {status: n for (where, status), n in counts.items() if where == placement}
            result.append(PlacementProgress(placement, total, done, failed, running,
                                            max(total - done - failed - running, 0), stored,
                                            max(total - sum(stored.values()), 0)))
        return result
