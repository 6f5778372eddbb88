"""Board leases: which coordinator may use a board now, shared by all coordinators of one store.

A coordinator takes a board's lease before it starts a run there and gives it back when the
result is stored; while the run is in flight it renews the lease (heartbeat). A lease whose
``expires`` has passed is free: a coordinator that died (SIGKILL, lost machine) blocks a board
for at most one lease time. Times are the coordinators' clocks in UTC, so the machines sharing
a store need synchronised clocks (NTP); the lease time should dwarf any skew.

Who goes next: a coordinator that finds the board taken waits for it (a ``board_waiters`` row
with its job's priority, refreshed at each try), and a free board goes to the best waiter that
still asks: the highest priority, then the one waiting longest. A holder that releases a board
it wants again queues behind the waiters of its priority (two equal coordinators alternate) and
ahead of lower ones (a higher-priority job keeps the board until its runs are done).

Taking a lease is atomic on every backend: a conditional UPDATE of the board's row (expired),
else an INSERT, whose primary key makes a second concurrent INSERT fail. A released lease keeps
its row, expired.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from db.connection import retry_locked
from db.models import BoardWaiter, Lease

# Tries of the update-else-insert race before a lease counts as taken by the winner.
ACQUIRE_TRIES = 3
# A waiter that has not asked again for this long has gone: it no longer holds the board up.
WAITER_S = 5.0


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


@dataclass(frozen=True)
class LeaseInfo:
    board: str
    lease_id: str
    holder: str
    experiment: str | None
    run_key: str | None
    acquired: datetime
    heartbeat: datetime
    expires: datetime


@dataclass(frozen=True)
class Claim:
    granted: LeaseInfo | None  # our new lease
    current: LeaseInfo | None  # else the lease in the way (None: it changed hands meanwhile)


def _lease_fields(values: Any) -> dict[str, Any]:
    return {name: values[name] for name in LeaseInfo.__dataclass_fields__ if name in values}


class Leases:
    """The ``leases`` table; ``database`` should open write transactions with BEGIN IMMEDIATE."""

    def __init__(self, database: Engine) -> None:
        self.database = database
        self.table = Lease.__table__
        self.waiters = BoardWaiter.__table__

    @retry_locked
    def acquire(self, board: str, holder: str, ttl_s: float, experiment: str | None = None,
                run_key: str | None = None, priority: int = 0) -> Claim:
        """Take ``board`` for ``holder`` when it is free and no better waiter asks for it.

        A holder that does not get it waits for it (with ``priority``) until it does; returns
        the claim: ``granted`` (our new lease) or the ``current`` lease (None: the board is
        free, a better waiter goes first).
        """
        table = self.table
        for _ in range(ACQUIRE_TRIES):
            moment = utcnow()
            values = {"lease_id": str(uuid.uuid4()), "holder": holder, "experiment": experiment,
                      "run_key": run_key, "acquired": moment, "heartbeat": moment,
                      "expires": moment + timedelta(seconds=ttl_s)}
            granted = Claim(LeaseInfo(board=board, **values), None)
            with self.database.begin() as conn:
                first = self._wait(conn, board, holder, priority, moment, keep_since=True)
                if first:
                    taken = conn.execute(update(table).where(
                        table.c.board == board, table.c.expires < moment).values(**values))
                    if taken.rowcount == 1:
                        self._stop_waiting(conn, board, holder)
                        return granted
                current = conn.execute(select(table).where(table.c.board == board)).first()
            if current is not None or not first:
                held = current is not None and current.expires >= moment
                return Claim(None, LeaseInfo(**_lease_fields(current._mapping)) if held else None)
            try:
                with self.database.begin() as conn:
                    conn.execute(insert(table).values(board=board, **values))
                    self._stop_waiting(conn, board, holder)
                return granted
            except IntegrityError:
                continue  # another coordinator inserted it first: look again
        return Claim(None, self.get(board))

    def _wait(self, conn: Connection, board: str, holder: str, priority: int,
              moment: datetime, keep_since: bool) -> bool:
        """Record ``holder`` as a waiter of ``board`` (since now, or since it began waiting
        with ``keep_since``); whether no fresh waiter goes before it."""
        waiters = self.waiters
        fresh = waiters.c.seen >= moment - timedelta(seconds=WAITER_S)
        mine = (waiters.c.board == board) & (waiters.c.holder == holder)
        since = conn.scalar(select(waiters.c.since).where(mine, fresh)) if keep_since else None
        since = since or moment
        row = {"priority": priority, "since": since, "seen": moment}
        if not conn.execute(update(waiters).where(mine).values(**row)).rowcount:
            conn.execute(insert(waiters).values(board=board, holder=holder, **row))
        ahead = conn.scalar(select(waiters.c.holder).where(
            waiters.c.board == board, waiters.c.holder != holder, fresh,
            (waiters.c.priority > priority)
            | ((waiters.c.priority == priority) & (waiters.c.since < since))).limit(1))
        return ahead is None

    def _stop_waiting(self, conn: Connection, board: str, holder: str) -> None:
        waiters = self.waiters
        conn.execute(delete(waiters).where(waiters.c.board == board, waiters.c.holder == holder))

    @retry_locked
    def renew(self, lease_ids: list[str], ttl_s: float) -> set[str]:
        """Push the expiry of these leases ``ttl_s`` ahead; returns the ids no longer held."""
        if not lease_ids:
            return set()
        moment = utcnow()
        table = self.table
        with self.database.begin() as conn:
            # an expired lease stays lost: another holder may have had the board meanwhile
            conn.execute(update(table).where(table.c.lease_id.in_(lease_ids),
                                             table.c.expires >= moment).values(
                heartbeat=moment, expires=moment + timedelta(seconds=ttl_s)))
            held = set(conn.scalars(select(table.c.lease_id).where(
                table.c.lease_id.in_(lease_ids), table.c.expires >= moment)))
        return set(lease_ids) - held

    @retry_locked
    def release(self, lease_id: str, again: int | None = None) -> None:
        """Free the board now; with ``again`` (a priority) its holder waits for it once more,
        behind the waiters of that priority."""
        table = self.table
        moment = utcnow()
        with self.database.begin() as conn:
            lease = conn.execute(select(table.c.board, table.c.holder)
                                 .where(table.c.lease_id == lease_id)).first()
            conn.execute(update(table).where(table.c.lease_id == lease_id)
                         .values(expires=moment))
            if lease is not None and again is not None:
                self._wait(conn, lease.board, lease.holder, again, moment, keep_since=False)

    @retry_locked
    def withdraw(self, holder: str) -> None:
        """``holder`` waits for no board any more (its coordinator is done with them)."""
        with self.database.begin() as conn:
            conn.execute(delete(self.waiters).where(self.waiters.c.holder == holder))

    def get(self, board: str) -> LeaseInfo | None:
        with self.database.connect() as conn:
            row = conn.execute(select(self.table).where(self.table.c.board == board)).first()
        return None if row is None else LeaseInfo(**_lease_fields(row._mapping))

    def active(self) -> list[LeaseInfo]:
        """The leases not expired, by board."""
        table = self.table
        with self.database.connect() as conn:
            rows = conn.execute(select(table).where(table.c.expires >= utcnow())
                                .order_by(table.c.board)).all()
        return [LeaseInfo(**_lease_fields(row._mapping)) for row in rows]
