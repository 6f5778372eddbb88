"""The farm's users: a name, an admin flag and the SHA-256 of a token each (the token itself
is shown once, when made, and never stored).

A store without users belongs to whoever runs benchfarm on it: the harness treats the local
OS user as its admin. The first user added must be an admin (else no one could add the next
one), and the last active admin cannot be revoked. A revoked user keeps their row: their name
stays theirs in everything recorded, and their token resolves to a revoked user, never to an
active one. ``add`` of a revoked name makes it active again with a new token.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, func, insert, select, update

from db.audit import AuditEvent, write
from db.connection import retry_locked
from db.errors import StoreInputError
from db.leases import utcnow
from db.models import User

# a user name: what a login name may be, and printable on any terminal
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class UserInfo:
    id: int
    name: str
    admin: bool
    created_at: datetime
    created_by: str
    revoked_at: datetime | None
    revoked_by: str | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise StoreInputError(f"user name {name!r}: use 1 to 64 letters, digits, '_', '.', '@' "
                              "or '-', not starting with '.', '@' or '-'")
    return name


def _info(row: Any) -> UserInfo:
    values = dict(row._mapping)
    values.pop("token_sha256")
    return UserInfo(**values)


class Users:
    """The ``users`` table; ``database`` should open write transactions with BEGIN IMMEDIATE."""

    def __init__(self, database: Engine) -> None:
        self.database = database
        self.table = User.__table__

    def exist(self) -> bool:
        """Whether the store has any user (revoked ones count: a store whose users were all
        revoked does not become everyone's)."""
        with self.database.connect() as conn:
            return conn.scalar(select(self.table.c.id).limit(1)) is not None

    def list(self) -> list[UserInfo]:
        with self.database.connect() as conn:
            return [_info(row) for row in conn.execute(select(self.table)
                                                       .order_by(self.table.c.name))]

    def by_token(self, token_sha256: str) -> UserInfo | None:
        """The user (active or revoked) whose token has this SHA-256, or None."""
        with self.database.connect() as conn:
            row = conn.execute(select(self.table).where(
                self.table.c.token_sha256 == token_sha256)).first()
        if row is None or not hmac.compare_digest(row.token_sha256, token_sha256):
            return None
        return _info(row)

    @retry_locked
    def add(self, name: str, admin: bool, token_sha256: str, event: AuditEvent) -> UserInfo:
        """A new user (or a revoked one made active again) whose token has this SHA-256."""
        check_name(name)
        if not SHA256_HEX.fullmatch(token_sha256):
            raise ValueError("token_sha256 must be 64 lowercase hex digits")
        table, moment = self.table, utcnow()
        values = {"admin": admin, "token_sha256": token_sha256, "created_at": moment,
                  "created_by": event.actor, "revoked_at": None, "revoked_by": None}
        with self.database.begin() as conn:
            if not admin and conn.scalar(select(table.c.id).limit(1)) is None:
                raise StoreInputError(f"{name} would be the store's first user, and the first "
                                      f"must be an admin: `benchfarm users add {name} --admin`")
            row = conn.execute(select(table).where(table.c.name == name)).first()
            if row is not None and row.revoked_at is None:
                raise StoreInputError(f"user {name} exists; for a new token, `benchfarm users "
                                      f"revoke {name}` then `benchfarm users add {name}`")
            if row is None:
                conn.execute(insert(table).values(name=name, **values))
            else:
                conn.execute(update(table).where(table.c.id == row.id).values(**values))
            write(conn, event, moment)
            return _info(conn.execute(select(table).where(table.c.name == name)).one())

    @retry_locked
    def revoke(self, name: str, event: AuditEvent) -> UserInfo:
        """Revoke the user's token (the last active admin stays)."""
        table, moment = self.table, utcnow()
        with self.database.begin() as conn:
            row = conn.execute(select(table).where(table.c.name == name)).first()
            if row is None:
                raise StoreInputError(f"no user {name}; `benchfarm users list` lists them")
            if row.revoked_at is not None:
                raise StoreInputError(f"user {name} was revoked already "
                                      f"({row.revoked_at:%Y-%m-%d %H:%M} UTC by {row.revoked_by})")
            if row.admin and conn.scalar(select(func.count()).select_from(table).where(
                    table.c.admin, table.c.revoked_at.is_(None))) == 1:
                raise StoreInputError(f"{name} is the last active admin; make another one "
                                      "first (`benchfarm users add NAME --admin`)")
            conn.execute(update(table).where(table.c.id == row.id).values(
                revoked_at=moment, revoked_by=event.actor))
            write(conn, event, moment)
            return _info(conn.execute(select(table).where(table.c.id == row.id)).one())
