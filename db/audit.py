"""The audit trail: who did what to which job, reservation, board or user, and when.

An action is written in the same transaction as the change it records (the store's write
methods take an ``event``), so a change is never stored without its record nor a record
without its change. ``acting_for`` names the owner when someone acted on another's job or
reservation (an admin, with ``--force`` or ``--owner``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, func, insert, or_, select

from db.connection import retry_locked
from db.leases import utcnow
from db.models import AuditRecord

TARGET_CHARS = 200  # the column's size
DETAIL_CHARS = 500  # a detail is a short line (a reason is capped here, whatever its size)


@dataclass(frozen=True)
class AuditEvent:
    """An action about to be stored: who (``checked``: a user's token said so, else the local
    OS user of a store without users), what, on what, for whom."""

    actor: str
    checked: bool
    action: str
    target: str = ""
    acting_for: str | None = None
    detail: str | None = None

    def on(self, target: str) -> AuditEvent:
        """The same event about ``target`` (known once the row exists: a new job's id)."""
        return replace(self, target=target)


@dataclass(frozen=True)
class AuditEntry:
    """A stored action."""

    id: int
    at: datetime
    actor: str
    checked: bool
    action: str
    target: str
    acting_for: str | None
    detail: str | None


def write(conn: Any, event: AuditEvent | None, moment: datetime | None = None) -> None:
    """Store ``event`` (if any) in the caller's transaction."""
    if event is None:
        return
    detail = event.detail
    if detail is not None and len(detail) > DETAIL_CHARS:
        detail = detail[:DETAIL_CHARS - 3] + "..."
    conn.execute(insert(AuditRecord.__table__).values(
        at=moment or utcnow(), actor=event.actor, checked=event.checked, action=event.action,
        target=event.target[:TARGET_CHARS], acting_for=event.acting_for, detail=detail))


class Audit:
    """The ``audit_events`` table; ``database`` should open write transactions with BEGIN
    IMMEDIATE."""

    def __init__(self, database: Engine) -> None:
        self.database = database
        self.table = AuditRecord.__table__

    @retry_locked
    def record(self, event: AuditEvent) -> None:
        """Store an action that changes nothing else in the store (a `serve` starting)."""
        with self.database.begin() as conn:
            write(conn, event)

    def _about(self, query: Any, person: str | None) -> Any:
        if person is None:
            return query
        return query.where(or_(self.table.c.actor == person, self.table.c.acting_for == person))

    def entries(self, limit: int | None = None, offset: int = 0,
                person: str | None = None) -> list[AuditEntry]:
        """The newest actions first; ``person``: only those they did or that were done for
        them."""
        query = self._about(select(self.table), person).order_by(self.table.c.id.desc())
        query = query.offset(offset).limit(limit)
        with self.database.connect() as conn:
            return [AuditEntry(**row._mapping) for row in conn.execute(query)]

    def count(self, person: str | None = None) -> int:
        query = self._about(select(func.count()).select_from(self.table), person)
        with self.database.connect() as conn:
            return int(conn.scalar(query))
