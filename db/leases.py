"""Board leases: which coordinator may use a board now, shared by all coordinators of one store.

A coordinator takes a board's lease before it starts a run there and gives it back when the
result is stored; while the run is in flight it renews the lease (heartbeat). A lease whose
``expires`` has passed is free: a coordinator that died (SIGKILL, lost machine) blocks a board
for at most one lease time. Times are the coordinators' clocks in UTC, so the machines sharing
a store need synchronised clocks (NTP); the lease time should dwarf any skew.

Taking a lease is atomic on every backend: a conditional UPDATE of the board's row (free or
already ours), else an INSERT, whose primary key makes a second concurrent INSERT fail.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, delete, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from db.engine import retry_locked
from db.models import Lease

# Tries of the update-else-insert race before a lease counts as taken by the winner.
ACQUIRE_TRIES = 3


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


class Leases:
    """The ``leases`` table; ``engine`` should open write transactions with BEGIN IMMEDIATE."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.table = Lease.__table__

    @retry_locked
    def acquire(self, board: str, holder: str, ttl_s: float, experiment: str | None = None,
                run_key: str | None = None) -> LeaseInfo:
        """Take ``board`` for ``holder`` when it is free (or already the holder's).

        Returns the new lease, or the current one of another holder when the board is taken:
        compare ``.holder`` with ``holder``.
        """
        table = self.table
        for _ in range(ACQUIRE_TRIES):
            moment = utcnow()
            values = {"lease_id": str(uuid.uuid4()), "holder": holder, "experiment": experiment,
                      "run_key": run_key, "acquired": moment, "heartbeat": moment,
                      "expires": moment + timedelta(seconds=ttl_s)}
            with self.engine.begin() as conn:
                taken = conn.execute(update(table).where(
                    table.c.board == board,
                    or_(table.c.expires < moment, table.c.holder == holder)).values(**values))
                if taken.rowcount == 1:
                    return LeaseInfo(board=board, **values)
                current = conn.execute(select(table).where(table.c.board == board)).first()
            if current is not None:
                return LeaseInfo(**current._mapping)
            try:
                with self.engine.begin() as conn:
                    conn.execute(insert(table).values(board=board, **values))
                return LeaseInfo(board=board, **values)
            except IntegrityError:
                continue  # another coordinator inserted it first: look again
        current_lease = self.get(board)
        if current_lease is None:
            raise RuntimeError(f"lease of {board!r}: it changed hands {ACQUIRE_TRIES} times "
                               "while being taken")
        return current_lease

    @retry_locked
    def renew(self, lease_ids: list[str], ttl_s: float) -> set[str]:
        """Push the expiry of these leases ``ttl_s`` ahead; returns the ids no longer held."""
        if not lease_ids:
            return set()
        moment = utcnow()
        table = self.table
        with self.engine.begin() as conn:
            conn.execute(update(table).where(table.c.lease_id.in_(lease_ids)).values(
                heartbeat=moment, expires=moment + timedelta(seconds=ttl_s)))
            held = set(conn.scalars(select(table.c.lease_id)
                                    .where(table.c.lease_id.in_(lease_ids))))
        return set(lease_ids) - held

    @retry_locked
    def release(self, lease_id: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(self.table).where(self.table.c.lease_id == lease_id))

    def get(self, board: str) -> LeaseInfo | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(self.table).where(self.table.c.board == board)).first()
        return None if row is None else LeaseInfo(**row._mapping)

    def active(self) -> list[LeaseInfo]:
        """The leases not expired, by board."""
        table = self.table
        with self.engine.connect() as conn:
            rows = conn.execute(select(table).where(table.c.expires >= utcnow())
                                .order_by(table.c.board)).all()
        return [LeaseInfo(**row._mapping) for row in rows]
