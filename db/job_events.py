"""A job's story: its events (``job_events``: every transition, with its time, who caused it and
why) and the attempts its coordinators made at its runs (measurements carrying its id).

Times are stored as naive UTC, like every time in the store, and read back with their zone
(``datetime`` with ``tzinfo=UTC``): what is shown or sent says its zone.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, func, insert, select

from db.models import JOB_EVENTS, Device, JobEvent, Measurement, Run

MAX_CAUSE_CHARS = 4000


@dataclass(frozen=True)
class JobEventInfo:
    at: datetime  # with its zone (UTC)
    event: str  # one of db.models.JOB_EVENTS
    actor: str | None  # the user or coordinator that caused it
    cause: str | None


@dataclass(frozen=True)
class JobAttempt:
    """One attempt a job's coordinator made at one of its runs."""

    run_id: int
    attempt: int
    device: str
    command: str
    policy: str | None
    k: int | None
    repeat: int
    status: str
    started_at: datetime | None  # with its zone (UTC)
    finished_at: datetime | None
    error: str | None


def aware(moment: datetime | None) -> datetime | None:
    """A stored (naive UTC) time with its zone."""
    return None if moment is None else moment.replace(tzinfo=UTC)


def record(conn: Any, job_id: int, event: str, moment: datetime, actor: str | None = None,
           cause: str | None = None) -> None:
    """Store one event of the job, in the caller's transaction (the one making the change)."""
    if event not in JOB_EVENTS:
        raise ValueError(f"job event {event!r}: allowed {', '.join(JOB_EVENTS)}")
    conn.execute(insert(JobEvent.__table__).values(
        job_id=job_id, at=moment, event=event, actor=actor,
        cause=None if cause is None else cause[:MAX_CAUSE_CHARS]))


def last_event(conn: Any, job_id: int) -> JobEventInfo | None:
    table = JobEvent.__table__
    row = conn.execute(select(table.c.at, table.c.event, table.c.actor, table.c.cause)
                       .where(table.c.job_id == job_id).order_by(table.c.id.desc())
                       .limit(1)).first()
    return None if row is None else JobEventInfo(aware(row.at), row.event, row.actor, row.cause)


def events(database: Engine, job_id: int) -> list[JobEventInfo]:
    """The job's events in the order they happened."""
    table = JobEvent.__table__
    with database.connect() as conn:
        rows = conn.execute(select(table.c.at, table.c.event, table.c.actor, table.c.cause)
                            .where(table.c.job_id == job_id).order_by(table.c.id)).all()
    return [JobEventInfo(aware(r.at), r.event, r.actor, r.cause) for r in rows]


def attempts(database: Engine, job_id: int) -> list[JobAttempt]:
    """The attempts the job's coordinators made, in the order they started."""
    with database.connect() as conn:
        rows = conn.execute(
            select(Measurement.run_id, Measurement.attempt, Device.name, Run.command, Run.policy,
                   Run.k, Run.repeat, Measurement.status, Measurement.started_at,
                   Measurement.finished_at, Measurement.error)
            .join(Run, Run.id == Measurement.run_id)
            .join(Device, Device.id == Measurement.device_id)
            .where(Measurement.job_id == job_id).order_by(Measurement.id)).all()
    return [JobAttempt(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], aware(r[8]), aware(r[9]),
                       r[10]) for r in rows]


def attempt_counts(database: Engine, job_id: int) -> dict[str, int]:
    """The job's attempts per status (ints), e.g. for its end's notification."""
    with database.connect() as conn:
        rows = conn.execute(select(Measurement.status, func.count())
                            .where(Measurement.job_id == job_id)
                            .group_by(Measurement.status)).all()
    return dict(Counter({status: int(n) for status, n in rows}))
