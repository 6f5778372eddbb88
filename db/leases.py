"""Board leases: which coordinator may use a board now, shared by all coordinators of one store.

A coordinator takes a board's lease before it starts a run there and gives it back when the
result is stored; while the run is in flight it renews the lease (heartbeat). A lease whose
``expires`` has passed is free: a coordinator that died (SIGKILL, lost machine) blocks a board
for at most one lease time. Times are the coordinators' clocks in UTC, so the machines sharing
a store need synchronised clocks (NTP); the lease time should dwarf any skew.

Taking a lease is atomic on every backend: a conditional UPDATE of the board's row (expired and
no other waiter), else an INSERT, whose primary key makes a second concurrent INSERT fail. A
released lease keeps its row, expired, so that the board's waiter is remembered.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.exc import IntegrityError

from db.connection import retry_locked
from db.models import Lease

# Tries of the update-else-insert race before a lease counts as taken by the winner.
ACQUIRE_TRIES = 3
# A waiter that has not asked again for this long has gone: the board is anyone's.
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
    """The ``leases`` table; ``engine`` should open write transactions with BEGIN IMMEDIATE."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.table = Lease.__table__

    @retry_locked
    def acquire(self, board: str, holder: str, ttl_s: float, experiment: str | None = None,
                run_key: str | None = None) -> Claim:
        """Take ``board`` for ``holder`` when it is free and no other coordinator waits for it.

        A holder that finds the board taken becomes its waiter, and the next holder to release
        it lets the waiter have it: two coordinators alternate instead of one starving the
        other. Returns the claim: ``granted`` (our new lease) or the ``current`` lease.
        """
        table = self.table
        for _ in range(ACQUIRE_TRIES):
            moment = utcnow()
            values = {"lease_id": str(uuid.uuid4()), "holder": holder, "experiment": experiment,
                      "run_key": run_key, "acquired": moment, "heartbeat": moment,
                      "expires": moment + timedelta(seconds=ttl_s), "waiter": None,
                      "waiting_since": None}
            fresh_waiter = (table.c.waiter.is_not(None) & (table.c.waiter != holder)
                            & (table.c.waiting_since >= moment - timedelta(seconds=WAITER_S)))
            with self.engine.begin() as conn:
                taken = conn.execute(update(table).where(
                    table.c.board == board, table.c.expires < moment,
                    ~fresh_waiter).values(**values))
                if taken.rowcount == 1:
                    return Claim(LeaseInfo(board=board, **_lease_fields(values)), None)
                conn.execute(update(table).where(
                    table.c.board == board, ~fresh_waiter).values(waiter=holder,
                                                                  waiting_since=moment))
                current = conn.execute(select(table).where(table.c.board == board)).first()
            if current is not None:
                return Claim(None, LeaseInfo(**_lease_fields(current._mapping)))
            try:
                with self.engine.begin() as conn:
                    conn.execute(insert(table).values(board=board, **values))
                return Claim(LeaseInfo(board=board, **_lease_fields(values)), None)
            except IntegrityError:
                continue  # another coordinator inserted it first: look again
        return Claim(None, self.get(board))

    @retry_locked
    def renew(self, lease_ids: list[str], ttl_s: float) -> set[str]:
        """Push the expiry of these leases ``ttl_s`` ahead; returns the ids no longer held."""
        if not lease_ids:
            return set()
        moment = utcnow()
        table = self.table
        with self.engine.begin() as conn:
            # an expired lease stays lost: another holder may have had the board meanwhile
            conn.execute(update(table).where(table.c.lease_id.in_(lease_ids),
                                             table.c.expires >= moment).values(
                heartbeat=moment, expires=moment + timedelta(seconds=ttl_s)))
            held = set(conn.scalars(select(table.c.lease_id).where(
                table.c.lease_id.in_(lease_ids), table.c.expires >= moment)))
        return set(lease_ids) - held

    @retry_locked
    def release(self, lease_id: str) -> None:
        """Free the board now; the row stays (with its waiter) for the next claim."""
        with self.engine.begin() as conn:
            conn.execute(update(self.table).where(self.table.c.lease_id == lease_id)
                         .values(expires=utcnow()))

    def get(self, board: str) -> LeaseInfo | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(self.table).where(self.table.c.board == board)).first()
        return None if row is None else LeaseInfo(**_lease_fields(row._mapping))

    def active(self) -> list[LeaseInfo]:
        """The leases not expired, by board."""
        table = self.table
        with self.engine.connect() as conn:
            rows = conn.execute(select(table).where(table.c.expires >= utcnow())
                                .order_by(table.c.board)).all()
        return [LeaseInfo(**_lease_fields(row._mapping)) for row in rows]
