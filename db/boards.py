"""The lab's boards over time: their states (with who, when and why), health checks,
reservations, and what they ran lately. Plain reads return dataclasses (the CLI and the
dashboard share them).

A board is ``online`` until someone sets another state: ``maintenance`` (drained: the run in
flight finishes, no new one starts), ``retired``, or ``bad``, which coordinators set by
themselves after ``bad_after`` runs in a row were lost on it (an infrastructure failure: the
board or its connection, not the engine) or after a failed health check. Every change is kept
in ``board_events``. A reservation keeps a board for one owner's jobs until it ends or is
released.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, func, insert, select, update

from db.audit import AuditEvent, write
from db.connection import retry_locked
from db.errors import StoreInputError
from db.leases import utcnow
from db.models import (
    BOARD_STATES,
    BoardEvent,
    BoardState,
    Device,
    DeviceSnapshot,
    Experiment,
    HealthCheck,
    Measurement,
    Reservation,
    Run,
)

ONLINE = "online"
BAD = "bad"


@dataclass(frozen=True)
class BoardStatus:
    board: str
    state: str
    reason: str | None
    since: datetime | None  # None: never changed (online from the start)
    changed_by: str | None
    failures: int  # runs lost in a row


@dataclass(frozen=True)
class StateChange:
    board: str
    state: str
    reason: str | None
    changed_by: str
    at: datetime


@dataclass(frozen=True)
class HealthResult:
    id: int
    board: str
    ok: bool
    items: list[dict[str, Any]]  # {"name", "ok", "detail"}
    checked_by: str
    checked_at: datetime

    @property
    def summary(self) -> str:
        failed = [f"{i['name']}: {i['detail']}" for i in self.items if not i["ok"]]
        return "ok" if self.ok else "FAILED " + "; ".join(failed)


@dataclass(frozen=True)
class ReservationInfo:
    id: int
    board: str
    owner: str
    reason: str | None
    starts: datetime
    ends: datetime
    released_at: datetime | None
    released_by: str | None


@dataclass(frozen=True)
class StoredBoard:
    """A board the store has runs of (its ``devices`` row)."""

    id: int
    name: str
    cls: str
    arch: str
    emulated: bool


@dataclass(frozen=True)
class LastAttempt:
    status: str
    finished_at: datetime | None


@dataclass(frozen=True)
class FailedAttempt:
    run_id: int
    device_id: int
    experiment: str  # the experiment that first stored the run
    finished_at: datetime | None
    error: str | None


@dataclass(frozen=True)
class BoardActivity:
    """What the boards ran lately, read in one transaction."""

    boards: list[StoredBoard]  # every board the store has runs of, by name
    last: dict[int, LastAttempt]  # device id -> its latest attempt (measurements: attempts)
    failed: list[FailedAttempt]  # the newest failed attempts of every board, newest first


def _online(board: str) -> BoardStatus:
    return BoardStatus(board, ONLINE, None, None, None, 0)


MAX_REASON_CHARS = 500  # a state's or a reservation's reason (stored, shown to everyone)
MAX_NAME_CHARS = 200  # an owner, who changed a state (the columns' size)


def checked_text(value: str | None, what: str, limit: int) -> str | None:
    """``value`` when it is at most ``limit`` characters; StoreInputError naming the bound."""
    if value is not None and len(value) > limit:
        raise StoreInputError(f"{what}: {len(value)} characters; at most {limit}")
    return value


def _cut(text: str | None) -> str | None:
    """A reason the harness writes (a board's error): cut to MAX_REASON_CHARS."""
    if text is None or len(text) <= MAX_REASON_CHARS:
        return text
    return text[:MAX_REASON_CHARS - 1] + "…"


class Boards:
    """The boards' tables; ``database`` should open write transactions with BEGIN IMMEDIATE."""

    def __init__(self, database: Engine) -> None:
        self.database = database

    # -- states -------------------------------------------------------------------------------

    @retry_locked
    def set_state(self, board: str, state: str, reason: str | None, by: str,
                  event: AuditEvent | None = None) -> BoardStatus:
        """Set the board's state (recorded in its history, and ``event`` with it); failures
        start again from 0."""
        if state not in BOARD_STATES:
            raise StoreInputError(f"board state {state!r}: allowed {', '.join(BOARD_STATES)}")
        checked_text(reason, "the reason", MAX_REASON_CHARS)
        checked_text(by, "who changed it", MAX_NAME_CHARS)
        moment = utcnow()
        with self.database.begin() as conn:
            self._write_state(conn, board, state, reason, by, moment)
            write(conn, event, moment)
        return BoardStatus(board, state, reason, moment, by, 0)

    @staticmethod
    def _write_state(conn: Any, board: str, state: str, reason: str | None, by: str,
                     moment: datetime) -> None:
        table = BoardState.__table__
        reason = _cut(reason)
        values = {"state": state, "reason": reason, "since": moment, "changed_by": by,
                  "failures": 0}
        if not conn.execute(update(table).where(table.c.board == board)
                            .values(**values)).rowcount:
            conn.execute(insert(table).values(board=board, **values))
        conn.execute(insert(BoardEvent.__table__).values(
            board=board, state=state, reason=reason, changed_by=by, at=moment))

    @retry_locked
    def note(self, board: str, reason: str, by: str) -> None:
        """An event in the board's history that leaves its state as it is: something seen
        on it (a step that coincides with a change of its conditions, not a commit's)."""
        moment = utcnow()
        with self.database.begin() as conn:
            state = conn.scalar(select(BoardState.__table__.c.state).where(
                BoardState.__table__.c.board == board)) or ONLINE
            conn.execute(insert(BoardEvent.__table__).values(
                board=board, state=state, reason=_cut(reason), changed_by=by, at=moment))

    def states(self, boards: list[str] | None = None,
               conn: Any = None) -> dict[str, BoardStatus]:
        """The state of each board named (every board with a stored state when None); on
        ``conn`` when given (inside the caller's write transaction: the rows are locked until
        it ends, so that a change of state commits before or after the decision it feeds,
        never during it; SQLite's writers are serialised already)."""
        if conn is None:
            with self.database.connect() as reading:
                return self._states(reading, boards, lock=False)
        return self._states(conn, boards, lock=True)

    @staticmethod
    def _states(conn: Any, boards: list[str] | None, lock: bool) -> dict[str, BoardStatus]:
        query = select(BoardState.__table__)
        if lock:
            query = query.with_for_update()
        if boards is not None:
            query = query.where(BoardState.__table__.c.board.in_(boards))
        rows = {r.board: BoardStatus(**r._mapping) for r in conn.execute(query)}
        names = sorted(rows) if boards is None else boards
        return {name: rows.get(name) or _online(name) for name in names}

    def activity(self, failures: int) -> BoardActivity:
        """Every board the store has runs of, each one's latest attempt, and the ``failures``
        newest failed attempts."""
        with self.database.connect() as conn:
            boards = [StoredBoard(*row) for row in conn.execute(
                select(Device.id, Device.name, Device.cls, Device.arch, Device.emulated)
                .order_by(Device.name))]
            # each board's newest attempt: one look-up a board in the (device_id, id) index
            newest = (select(func.max(Measurement.id)).where(Measurement.device_id == Device.id)
                      .correlate(Device).scalar_subquery())
            last_ids = select(newest).select_from(Device)
            last = {device_id: LastAttempt(status, at) for device_id, status, at in conn.execute(
                select(Measurement.device_id, Measurement.status, Measurement.finished_at)
                .where(Measurement.id.in_(last_ids)))}
            failed = [FailedAttempt(*row) for row in conn.execute(
                select(Measurement.run_id, Measurement.device_id, Experiment.name,
                       Measurement.finished_at, Measurement.error)
                .join(Run, Run.id == Measurement.run_id)
                .join(Experiment, Experiment.id == Run.experiment_id)
                .where(Measurement.status == "failed").order_by(Measurement.id.desc())
                .limit(failures))]
        return BoardActivity(boards, last, failed)

    def history(self, board: str, newest: int | None = None) -> list[StateChange]:
        """The board's events (its state changes and ``note``s), oldest first; only the
        ``newest`` ones when given."""
        table = BoardEvent.__table__
        with self.database.connect() as conn:
            rows = conn.execute(select(table).where(table.c.board == board)
                                .order_by(table.c.id.desc()).limit(newest)).all()
        return [StateChange(r.board, r.state, r.reason, r.changed_by, r.at)
                for r in reversed(rows)]

    @retry_locked
    def record_failure(self, board: str, error: str, by: str, bad_after: int) -> bool:
        """Count a lost run on the board; at ``bad_after`` in a row an online board becomes
        bad. Returns whether this call made it bad."""
        table = BoardState.__table__
        moment = utcnow()
        with self.database.begin() as conn:
            row = conn.execute(select(table).where(table.c.board == board)).first()
            if row is None:
                conn.execute(insert(table).values(board=board, state=ONLINE, reason=None,
                                                  since=moment, changed_by=by, failures=0))
                state, failures = ONLINE, 1
            else:
                state, failures = row.state, row.failures + 1
            if state == ONLINE and failures >= bad_after:
                self._write_state(conn, board, BAD, f"{failures} runs lost in a row; last: "
                                  f"{error}", by, moment)
                return True
            conn.execute(update(table).where(table.c.board == board)
                         .values(failures=failures))
        return False

    @retry_locked
    def clear_failures(self, board: str) -> None:
        table = BoardState.__table__
        with self.database.begin() as conn:
            conn.execute(update(table).where(table.c.board == board, table.c.failures > 0)
                         .values(failures=0))

    # -- health checks ------------------------------------------------------------------------

    @retry_locked
    def record_health(self, board: str, ok: bool, items: list[dict[str, Any]],
                      by: str, event: AuditEvent | None = None) -> bool:
        """Store a health check (and ``event`` with it); a failed one makes an online board
        bad. Returns whether this call made it bad."""
        moment = utcnow()
        with self.database.begin() as conn:
            conn.execute(insert(HealthCheck.__table__).values(
                board=board, ok=ok, items=items, checked_by=by, checked_at=moment))
            write(conn, event, moment)
            if ok:
                return False
            table = BoardState.__table__
            state = conn.scalar(select(table.c.state).where(table.c.board == board)) or ONLINE
            if state != ONLINE:
                return False
            failed = "; ".join(f"{i['name']}: {i['detail']}" for i in items if not i["ok"])
            self._write_state(conn, board, BAD, f"health check failed: {failed}", by, moment)
        return True

    def health(self, board: str, limit: int = 20) -> list[HealthResult]:
        """The board's newest health checks, newest first."""
        table = HealthCheck.__table__
        with self.database.connect() as conn:
            rows = conn.execute(select(table).where(table.c.board == board)
                                .order_by(table.c.id.desc()).limit(limit)).all()
        return [HealthResult(**r._mapping) for r in rows]

    def last_health(self, boards: list[str]) -> dict[str, HealthResult]:
        """The newest health check of each board that has one."""
        table = HealthCheck.__table__
        with self.database.connect() as conn:
            rows = conn.execute(select(table).where(table.c.board.in_(boards))
                                .order_by(table.c.id)).all()
        return {r.board: HealthResult(**r._mapping) for r in rows}

    # -- reservations -------------------------------------------------------------------------

    @retry_locked
    def newest_facts(self, boards: list[str]) -> dict[str, dict[str, Any]]:
        """What each board's newest fingerprint recorded of its CPU and memory:
        ``cpu_features`` (devices.isa decides its instruction-set level from them) and
        ``mem_total_kb`` (whether a model fits, harness.plan.fit), each where recorded; boards
        never fingerprinted are left out."""
        found: dict[str, dict[str, Any]] = {}
        with self.database.connect() as conn:
            for board in boards:
                fingerprint = conn.scalar(
                    select(DeviceSnapshot.fingerprint)
                    .join(Measurement, DeviceSnapshot.measurement_id == Measurement.id)
                    .join(Device, Measurement.device_id == Device.id)
                    .where(Device.name == board)
                    # the device's newest measurement first: its (device_id, id) index
                    .order_by(Measurement.id.desc(), DeviceSnapshot.id.desc()).limit(1))
                if not isinstance(fingerprint, dict):
                    continue
                facts = {key: fingerprint[key] for key in ("cpu_features", "mem_total_kb")
                         if fingerprint.get(key)}
                if facts:
                    found[board] = facts
        return found

    def reserve(self, board: str, owner: str, ends: datetime, reason: str | None,
                event: AuditEvent | None = None) -> ReservationInfo:
        """Keep the board for ``owner`` until ``ends``; refused while another owner holds it.
        ``event`` is recorded with it."""
        checked_text(owner, "the owner", MAX_NAME_CHARS)
        checked_text(reason, "the reason", MAX_REASON_CHARS)
        moment = utcnow()
        with self.database.begin() as conn:
            held = self._active(conn, board, moment)
            if held is not None and held.owner != owner:
                raise StoreInputError(
                    f"board {board!r} is reserved by {held.owner} until "
                    f"{held.ends:%Y-%m-%d %H:%M} UTC; they can `benchfarm release {board}`")
            write(conn, event, moment)
            if held is not None:  # the owner's own: extended or shortened
                conn.execute(update(Reservation.__table__).where(
                    Reservation.__table__.c.id == held.id).values(ends=ends, reason=reason))
                return ReservationInfo(**{**held.__dict__, "ends": ends, "reason": reason})
            new_id = conn.execute(insert(Reservation.__table__).values(
                board=board, owner=owner, reason=reason, starts=moment,
                ends=ends)).inserted_primary_key[0]
        return ReservationInfo(new_id, board, owner, reason, moment, ends, None, None)

    @retry_locked
    def release(self, board: str, by: str,
                allowed: Callable[[ReservationInfo], AuditEvent | None] | None = None
                ) -> ReservationInfo | None:
        """End the board's reservation now; the one released, or None when there was none.

        ``allowed`` is asked in the same transaction, about the reservation in force: it
        raises to refuse (nothing changes), or returns the event to record with the release.
        """
        moment = utcnow()
        with self.database.begin() as conn:
            held = self._active(conn, board, moment)
            if held is not None:
                event = allowed(held) if allowed is not None else None
                conn.execute(update(Reservation.__table__).where(
                    Reservation.__table__.c.id == held.id).values(released_at=moment,
                                                                  released_by=by))
                write(conn, event, moment)
        return held

    @staticmethod
    def _active(conn: Any, board: str, moment: datetime) -> ReservationInfo | None:
        table = Reservation.__table__
        row = conn.execute(select(table).where(
            table.c.board == board, table.c.released_at.is_(None), table.c.starts <= moment,
            table.c.ends > moment).order_by(table.c.id.desc())).first()
        return None if row is None else ReservationInfo(**row._mapping)

    def reservations(self, boards: list[str] | None = None,
                     conn: Any = None) -> dict[str, ReservationInfo]:
        """The reservations in force now, by board (on ``conn`` when given: locked as
        ``states`` locks the boards' states)."""
        if conn is None:
            with self.database.connect() as reading:
                return self._reservations(reading, boards, lock=False)
        return self._reservations(conn, boards, lock=True)

    @staticmethod
    def _reservations(conn: Any, boards: list[str] | None,
                      lock: bool) -> dict[str, ReservationInfo]:
        table = Reservation.__table__
        moment = utcnow()
        query = select(table).where(table.c.released_at.is_(None), table.c.starts <= moment,
                                    table.c.ends > moment).order_by(table.c.id)
        if lock:
            query = query.with_for_update()
        if boards is not None:
            query = query.where(table.c.board.in_(boards))
        return {r.board: ReservationInfo(**r._mapping) for r in conn.execute(query)}
