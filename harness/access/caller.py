"""Who runs a command, as the store checks it, and what they may do to what others own.

While the store has no users, the local OS user is its admin: a single-user setup needs no
set-up and behaves as it always did. Once it has one, every command that acts (runs, submits,
cancels, reserves, releases, changes a board) presents a user's token from the token file
(``tokens.token_file``); a missing, unknown or revoked token stops it (exit 2) saying what to
do. Root is not special: an admin is a user the store marks admin.

Acting on someone else's job or reservation (``Caller.acting_for``) needs an admin who says
so (``--force``, or ``--owner NAME``), and is recorded as done by the admin for the owner.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from db.audit import AuditEvent
from harness.access.tokens import TOKEN_FILE_ENV, read_token_file, token_file, token_sha256
from harness.errors import InputError

if TYPE_CHECKING:
    from db.store import Store
    from db.users import UserInfo


class IdentityError(InputError):
    """The store has users and this caller presented no valid token (exit 2)."""


class NotPermitted(InputError):
    """The caller may not do this (exit 2)."""


@dataclass(frozen=True)
class Caller:
    name: str
    admin: bool
    checked: bool  # a user's token said who; False: the local OS user of a store without users

    @property
    def shown(self) -> str:
        return self.name + ("" if self.checked else " (local user; the store has no users)")

    def event(self, action: str, target: str = "", acting_for: str | None = None,
              detail: str | None = None) -> AuditEvent:
        return AuditEvent(self.name, self.checked, action, target, acting_for, detail)

    def acting_for(self, owner: str, thing: str, verb: str, *, forced: bool) -> str | None:
        """Acting on ``thing`` (a job, a reservation), which ``owner`` owns: None when that is
        the caller; ``owner`` when an admin acts for them and said so (``--force``); else
        NotPermitted saying who may."""
        if owner == self.name:
            return None
        if not self.admin:
            raise NotPermitted(f"{thing} belongs to {owner}: only {owner} or an admin may "
                               f"{verb} it (you are {self.name}; `benchfarm users list` shows "
                               "the admins)")
        if not forced:
            raise NotPermitted(f"{thing} belongs to {owner}; {verb} it with --force (it records "
                               f"that you did, for {owner})")
        return owner

    def as_owner(self, owner: str | None) -> str | None:
        """``--owner NAME``: None when it names no one else; ``NAME`` for an admin; else
        NotPermitted (naming whoever you like is not who you are)."""
        if owner is None or owner == self.name:
            return None
        if not self.admin:
            raise NotPermitted(f"--owner {owner}: only an admin may act for someone else (you "
                               f"are {self.name}; `benchfarm users list` shows the admins)")
        return owner

    def require_admin(self, what: str) -> None:
        if not self.admin:
            raise NotPermitted(f"{what} needs an admin (you are {self.name}; `benchfarm users "
                               "list` shows the admins)")


def local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        return f"uid-{os.getuid()}"


def resolve_caller(store: Store, path: Path | None = None) -> Caller:
    """The caller: the local OS user (an admin) while the store has no users, else the active
    user whose token ``path`` (default: the token file) holds."""
    if not store.users.exist():
        return Caller(local_user(), admin=True, checked=False)
    path = path or token_file()
    token = read_token_file(path)
    if token is None:
        raise IdentityError(
            f"this store has users, so benchfarm needs your token, and {path} does not exist "
            f"(${TOKEN_FILE_ENV} names another file): ask an admin for one (`benchfarm users "
            "add NAME` prints it), then save it with `benchfarm users login`")
    user = store.users.by_token(token_sha256(token))
    if user is None:
        raise IdentityError(f"the token in {path} is no user's of this store (mistyped, or "
                            "another store's): ask an admin for yours (`benchfarm users add "
                            "NAME`)")
    if not user.active:
        raise IdentityError(f"the token in {path} is {user.name}'s, revoked "
                            f"{user.revoked_at:%Y-%m-%d %H:%M} UTC by {user.revoked_by}: ask an "
                            f"admin for a new one (`benchfarm users add {user.name}`)")
    return Caller(user.name, user.admin, checked=True)


def user_of_token(store: Store, token: str) -> UserInfo | None:
    """The active user whose token this is, or None (the dashboard's login)."""
    user = store.users.by_token(token_sha256(token))
    return user if user is not None and user.active else None
