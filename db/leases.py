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
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, delete, insert, select, update
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


# The statements of every take and release, built once (a run takes and releases its board:
# building them per call cost more than running them). Parameters are named ``p_*`` so that
# none is taken for a column of the SET clause.
_LEASES = Lease.__table__
_WAITERS = BoardWaiter.__table__
_LEASE_COLUMNS = ("lease_id", "holder", "experiment", "run_key", "acquired", "heartbeat",
                  "expires")
# the board's lease for a new holder, when it has expired
_TAKE = update(_LEASES).where(_LEASES.c.board == bindparam("p_board"),
                              _LEASES.c.expires < bindparam("p_moment")).values(
    {name: bindparam(f"p_{name}") for name in _LEASE_COLUMNS})
_LEASE_OF = select(_LEASES).where(_LEASES.c.board == bindparam("p_board"))
_HOLDER_OF = select(_LEASES.c.board, _LEASES.c.holder).where(
    _LEASES.c.lease_id == bindparam("p_lease_id"))
_EXPIRE = update(_LEASES).where(_LEASES.c.lease_id == bindparam("p_lease_id")).values(
    expires=bindparam("p_moment"))
# the board's fresh waiters (those that asked within WAITER_S)
_FRESH_WAITERS = select(_WAITERS.c.holder, _WAITERS.c.priority, _WAITERS.c.since).where(
    _WAITERS.c.board == bindparam("p_board"), _WAITERS.c.seen >= bindparam("p_fresh"))
_MINE = (_WAITERS.c.board == bindparam("p_board")) & (_WAITERS.c.holder == bindparam("p_holder"))
_WAIT_AGAIN = update(_WAITERS).where(_MINE).values(
    priority=bindparam("p_priority"), since=bindparam("p_since"), seen=bindparam("p_seen"))
_WAIT = insert(_WAITERS).values(
    board=bindparam("p_board"), holder=bindparam("p_holder"), priority=bindparam("p_priority"),
    since=bindparam("p_since"), seen=bindparam("p_seen"))
_STOP_WAITING = delete(_WAITERS).where(_MINE)
# a hand-over: the holder's live lease becomes its new one (see Leases.hand_over)
_WAITERS_OF = select(_WAITERS.c.holder, _WAITERS.c.priority, _WAITERS.c.since,
                     _WAITERS.c.seen).where(_WAITERS.c.board == bindparam("p_board"))
_PASS_ON = update(_LEASES).where(_LEASES.c.lease_id == bindparam("p_old"),
                                 _LEASES.c.expires >= bindparam("p_moment")).values(
    {name: bindparam(f"p_{name}") for name in _LEASE_COLUMNS})


class Leases:
    """The ``leases`` table; ``database`` should open write transactions with BEGIN IMMEDIATE."""

    def __init__(self, database: Engine) -> None:
        self.database = database
        self.table = _LEASES
        self.waiters = _WAITERS

    @retry_locked
    def acquire(self, board: str, holder: str, ttl_s: float, experiment: str | None = None,
                run_key: str | None = None, priority: int = 0,
                on_grant: Callable[[Connection, LeaseInfo], Any] | None = None) -> Claim:
        """Take ``board`` for ``holder`` when it is free and no better waiter asks for it.

        A holder that does not get it waits for it (with ``priority``) until it does; returns
        the claim: ``granted`` (our new lease) or the ``current`` lease (None: the board is
        free, a better waiter goes first). ``on_grant(conn, lease)`` runs in the transaction
        that grants the lease (the store's sweep for attempts whose coordinator died, the
        attempt the lease is for); a retried transaction runs it again.
        """
        for _ in range(ACQUIRE_TRIES):
            moment = utcnow()
            values = {"lease_id": str(uuid.uuid4()), "holder": holder, "experiment": experiment,
                      "run_key": run_key, "acquired": moment, "heartbeat": moment,
                      "expires": moment + timedelta(seconds=ttl_s)}
            granted = Claim(LeaseInfo(board=board, **values), None)
            mine = {"p_board": board, "p_holder": holder}
            with self.database.begin() as conn:
                since, first = self._first(conn, board, holder, priority, moment)
                if first:
                    taken = conn.execute(_TAKE, {"p_board": board, "p_moment": moment,
                                                 **{f"p_{k}": v for k, v in values.items()}})
                    if taken.rowcount == 1:
                        conn.execute(_STOP_WAITING, mine)
                        if on_grant is not None:
                            on_grant(conn, granted.granted)
                        return granted
                self._wait(conn, board, holder, priority, since, moment)
                current = conn.execute(_LEASE_OF, {"p_board": board}).first()
            if current is not None or not first:
                held = current is not None and current.expires >= moment
                return Claim(None, LeaseInfo(**_lease_fields(current._mapping)) if held else None)
            try:
                with self.database.begin() as conn:
                    conn.execute(insert(_LEASES).values(board=board, **values))
                    conn.execute(_STOP_WAITING, mine)
                    if on_grant is not None:
                        on_grant(conn, granted.granted)
                return granted
            except IntegrityError:
                continue  # another coordinator inserted it first: look again
        return Claim(None, self.get(board))

    def hand_over(self, lease_id: str, board: str, holder: str, ttl_s: float,
                  experiment: str | None = None, run_key: str | None = None, priority: int = 0,
                  on_grant: Callable[[Connection, LeaseInfo], Any] | None = None) -> Claim:
        """``release(lease_id, again=priority)`` and at once ``acquire(board, ...)``: the
        holder's board goes from one of its runs to its next. When the lease is still live
        and no fresh waiter goes first, that is one transaction whose outcome is the pair's (a
        new lease for the holder, no waiter row of its own); otherwise it is the pair itself."""
        claim = self._pass_on(lease_id, board, holder, ttl_s, experiment, run_key, priority,
                              on_grant)
        if claim is not None:
            return claim
        self.release(lease_id, again=priority)
        return self.acquire(board, holder, ttl_s, experiment, run_key, priority, on_grant)

    @retry_locked
    def _pass_on(self, lease_id: str, board: str, holder: str, ttl_s: float,
                 experiment: str | None, run_key: str | None, priority: int,
                 on_grant: Callable[[Connection, LeaseInfo], Any] | None) -> Claim | None:
        """The holder's live lease replaced by its new one when no fresh waiter goes before
        it (as it would once it had released the board and asked again: since now); None, with
        nothing written, otherwise."""
        moment = utcnow()
        values = {"lease_id": str(uuid.uuid4()), "holder": holder, "experiment": experiment,
                  "run_key": run_key, "acquired": moment, "heartbeat": moment,
                  "expires": moment + timedelta(seconds=ttl_s)}
        fresh = moment - timedelta(seconds=WAITER_S)
        with self.database.begin() as conn:
            waiting = conn.execute(_WAITERS_OF, {"p_board": board}).all()
            if any(w.holder != holder and w.seen >= fresh and (w.priority > priority or (
                    w.priority == priority and w.since < moment)) for w in waiting):
                return None
            passed = conn.execute(_PASS_ON, {"p_old": lease_id, "p_moment": moment,
                                             **{f"p_{k}": v for k, v in values.items()}})
            if passed.rowcount != 1:  # the lease lapsed meanwhile
                return None
            if any(w.holder == holder for w in waiting):
                conn.execute(_STOP_WAITING, {"p_board": board, "p_holder": holder})
            lease = LeaseInfo(board=board, **values)
            if on_grant is not None:
                on_grant(conn, lease)
        return Claim(lease, None)

    def _first(self, conn: Connection, board: str, holder: str, priority: int,
               moment: datetime) -> tuple[datetime, bool]:
        """Since when ``holder`` waits for ``board`` (now, unless it is a fresh waiter already),
        and whether no fresh waiter goes before it: a higher priority, or the same one waiting
        longer."""
        waiting = conn.execute(_FRESH_WAITERS, {
            "p_board": board, "p_fresh": moment - timedelta(seconds=WAITER_S)}).all()
        since = next((w.since for w in waiting if w.holder == holder), None) or moment
        first = not any(w.holder != holder and (w.priority > priority or (
            w.priority == priority and w.since < since)) for w in waiting)
        return since, first

    def _wait(self, conn: Connection, board: str, holder: str, priority: int,
              since: datetime, moment: datetime) -> None:
        """Record ``holder`` as a waiter of ``board`` since ``since``, seen now."""
        row = {"p_board": board, "p_holder": holder, "p_priority": priority, "p_since": since,
               "p_seen": moment}
        if not conn.execute(_WAIT_AGAIN, row).rowcount:
            conn.execute(_WAIT, row)

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
        moment = utcnow()
        with self.database.begin() as conn:
            lease = conn.execute(_HOLDER_OF, {"p_lease_id": lease_id}).first()
            conn.execute(_EXPIRE, {"p_lease_id": lease_id, "p_moment": moment})
            if lease is not None and again is not None:
                self._wait(conn, lease.board, lease.holder, again, moment, moment)

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
