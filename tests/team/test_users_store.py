"""The store's users and audit trail (db/users.py, db/audit.py) on SQLite and, opted in,
PostgreSQL: the rules that keep a farm from locking itself out or opening itself up, and an
action recorded in the transaction of the change it records (a refused change records
nothing)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from db.audit import AuditEvent
from db.errors import StoreInputError
from db.leases import utcnow
from db.store import Store
from harness.access.tokens import new_token, token_sha256


def event(actor: str, action: str, target: str = "", acting_for: str | None = None
          ) -> AuditEvent:
    return AuditEvent(actor, True, action, target, acting_for)


def test_the_first_user_is_an_admin_and_the_last_admin_stays(store: Store) -> None:
    assert not store.users.exist()
    with pytest.raises(StoreInputError, match="first must be an admin"):
        store.users.add("bob", False, token_sha256(new_token()), event("root", "user-add"))
    assert not store.users.exist() and store.audit.count() == 0  # nothing half-done
    store.users.add("alice", True, token_sha256(new_token()), event("root", "user-add"))
    store.users.add("bob", False, token_sha256(new_token()), event("alice", "user-add"))
    with pytest.raises(StoreInputError, match="user bob exists"):
        store.users.add("bob", True, token_sha256(new_token()), event("alice", "user-add"))
    with pytest.raises(StoreInputError, match="last active admin"):
        store.users.revoke("alice", event("alice", "user-revoke"))
    store.users.revoke("bob", event("alice", "user-revoke"))
    assert store.users.exist()  # revoked users count: the store never becomes everyone's
    assert [(u.name, u.admin, u.active) for u in store.users.list()] == [
        ("alice", True, True), ("bob", False, False)]
    assert [e.action for e in store.audit.entries()] == ["user-revoke", "user-add", "user-add"]


@pytest.mark.parametrize("name", ["", "-rf", "a b", "ann\x1b[2J", "x" * 65, ".hidden"])
def test_a_user_name_is_a_plain_login_name(store: Store, name: str) -> None:
    with pytest.raises(StoreInputError, match="user name"):
        store.users.add(name, True, token_sha256(new_token()), event("root", "user-add"))


def test_a_token_resolves_to_its_user_revoked_or_not_and_a_new_one_replaces_it(
        store: Store) -> None:
    first, second = new_token(), new_token()
    store.users.add("alice", True, token_sha256(new_token()), event("root", "user-add"))
    store.users.add("bob", False, token_sha256(first), event("alice", "user-add"))
    assert store.users.by_token(token_sha256(first)).name == "bob"
    assert store.users.by_token(token_sha256(second)) is None
    store.users.revoke("bob", event("alice", "user-revoke"))
    revoked = store.users.by_token(token_sha256(first))
    assert revoked.name == "bob" and not revoked.active and revoked.revoked_by == "alice"
    store.users.add("bob", False, token_sha256(second), event("alice", "user-add"))
    assert store.users.by_token(token_sha256(first)) is None
    assert store.users.by_token(token_sha256(second)).active


def test_a_refused_release_changes_and_records_nothing(store: Store) -> None:
    ends = utcnow() + timedelta(hours=1)
    store.boards.reserve("rk-1", "carol", ends, "demo", event("carol", "reserve", "board rk-1"))

    def refuse(_held: object) -> AuditEvent:
        raise StoreInputError("not yours")

    with pytest.raises(StoreInputError, match="not yours"):
        store.boards.release("rk-1", "bob", refuse)
    assert store.boards.reservations()["rk-1"].owner == "carol"
    assert [e.action for e in store.audit.entries()] == ["reserve"]
    held = store.boards.release("rk-1", "alice", lambda held: event(
        "alice", "release", "board rk-1", held.owner))
    assert held.owner == "carol" and store.boards.reservations() == {}
    released = store.audit.entries()[0]
    assert (released.actor, released.acting_for) == ("alice", "carol")


def test_a_jobs_event_names_the_new_job_and_a_cancel_of_an_ended_job_records_nothing(
        store: Store) -> None:
    job = store.jobs.add("exp", "exp.toml", "name = 'exp'\n", owner="bob",
                         event=event("alice", "submit", acting_for="bob"))
    assert store.audit.entries()[0].target == f"job {job}"
    assert store.jobs.cancel(job, "bob", "mine", event("bob", "cancel", f"job {job}"))
    assert not store.jobs.cancel(job, "bob", "again", event("bob", "cancel", f"job {job}"))
    assert [e.action for e in store.audit.entries()] == ["cancel", "submit"]
    assert store.audit.count("bob") == 2 and store.audit.count("alice") == 1
