"""What each board did over a window (the dashboard's per-board timeline): its attempts with
their experiment, its state changes, its reservations, and the jobs that ran meanwhile. Plain
reads of the store; ``harness.web.timeline`` lays them out."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, or_, select

from db.models import BoardEvent, Device, Experiment, Job, Measurement, Reservation, Run


@dataclass(frozen=True)
class Attempt:
    board: str
    experiment: str
    started: datetime
    finished: datetime | None  # None: still running


@dataclass(frozen=True)
class Kept:
    board: str
    owner: str
    starts: datetime
    ends: datetime  # its end, or when it was released


@dataclass(frozen=True)
class JobSpan:
    id: int
    experiment: str
    started: datetime
    finished: datetime | None


@dataclass(frozen=True)
class BoardDays:
    attempts: list[Attempt]
    changes: list[tuple[str, str, datetime]]  # (board, state, at), oldest first, all time
    reservations: list[Kept]
    jobs: list[JobSpan]


def board_days(database: Engine, since: datetime) -> BoardDays:
    """Everything that touches the window from ``since`` to now. The state changes are read
    in full (a board's state at ``since`` is its last change before it; they are few)."""
    with database.connect() as conn:
        # in the attempts' order, sorted here: ordered by id in SQL, SQLite walks every
        # measurement by id instead of reading the window's few off the finished_at index
        # (at a million measurements: 250 ms against 0.2)
        attempts = [Attempt(*row[1:]) for row in sorted(conn.execute(
            select(Measurement.id, Device.name, Experiment.name, Measurement.started_at,
                   Measurement.finished_at)
            .join(Device, Device.id == Measurement.device_id)
            .join(Run, Run.id == Measurement.run_id)
            .join(Experiment, Experiment.id == Run.experiment_id)
            .where(Measurement.started_at.is_not(None),
                   or_(Measurement.finished_at.is_(None), Measurement.finished_at >= since))))]
        changes = [tuple(row) for row in conn.execute(
            select(BoardEvent.board, BoardEvent.state, BoardEvent.at).order_by(BoardEvent.id))]
        reservations = [Kept(board, owner, starts, min(ends, released or ends))
                        for board, owner, starts, ends, released in conn.execute(
            select(Reservation.board, Reservation.owner, Reservation.starts, Reservation.ends,
                   Reservation.released_at).where(Reservation.ends >= since))]
        jobs = [JobSpan(*row) for row in conn.execute(
            select(Job.id, Job.experiment, Job.started_at, Job.finished_at)
            .where(Job.started_at.is_not(None),
                   or_(Job.finished_at.is_(None), Job.finished_at >= since)))]
    return BoardDays(attempts, changes, reservations, jobs)
