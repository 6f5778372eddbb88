"""Board leases and the job queue in the store (SQLite, and PostgreSQL when opted in): taking,
waiting, turns, expiry, concurrent coordinators, and the 0003 migration of existing stores."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fixtures_db import add_refs, insert_old_run, refs_before_engines, sample_result
from sqlalchemy import event
from sqlalchemy.exc import IntegrityError

from db.connection import connect_database, migrate
from db.leases import utcnow
from db.models import Measurement
from db.store import Store
from harness.execution.leases import job_heartbeat


def test_a_taken_board_is_refused_then_handed_over(store: Store) -> None:
    leases = store.leases
    first = leases.acquire("board", "A", 30, "exp-a", "key-1").granted
    assert first is not None and first.holder == "A"
    refused = leases.acquire("board", "B", 30, "exp-b", "key-2")
    assert refused.granted is None and refused.current.holder == "A"
    assert refused.current.experiment == "exp-a" and refused.current.run_key == "key-1"
    assert [lease.board for lease in leases.active()] == ["board"]
    assert leases.renew([first.lease_id], 30) == set()
    leases.release(first.lease_id)
    # B asked while A held it: B's turn now, even though A asks first
    assert leases.acquire("board", "A", 30).granted is None
    second = leases.acquire("board", "B", 30, "exp-b", "key-2").granted
    assert second is not None and second.lease_id != first.lease_id
    # A's old lease cannot be renewed back into life
    assert leases.renew([first.lease_id], 30) == {first.lease_id}
    assert leases.get("board").holder == "B"


def test_the_next_lease_goes_to_the_highest_priority_then_the_longest_waiting(
        store: Store) -> None:
    leases = store.leases
    held = leases.acquire("board", "low-a", 30, priority=1).granted
    assert held is not None
    # waiting, in this order: another priority-1 coordinator, then a priority-5 one
    assert leases.acquire("board", "low-b", 30, priority=1).granted is None
    assert leases.acquire("board", "high", 30, priority=5).granted is None
    leases.release(held.lease_id, again=1)  # low-a wants it again
    assert leases.acquire("board", "low-b", 30, priority=1).granted is None
    assert leases.acquire("board", "low-a", 30, priority=1).granted is None
    turn = leases.acquire("board", "high", 30, priority=5).granted
    assert turn is not None
    # the priority-5 holder wants it again: it goes before both waiting priority-1 ones
    leases.release(turn.lease_id, again=5)
    assert leases.acquire("board", "low-b", 30, priority=1).granted is None
    turn = leases.acquire("board", "high", 30, priority=5).granted
    assert turn is not None
    leases.release(turn.lease_id)  # done with it
    # then the priority-1 coordinators in the order they began to wait
    assert leases.acquire("board", "low-a", 30, priority=1).granted is None
    turn = leases.acquire("board", "low-b", 30, priority=1).granted
    assert turn is not None
    leases.release(turn.lease_id, again=1)
    assert leases.acquire("board", "low-b", 30, priority=1).granted is None
    assert leases.acquire("board", "low-a", 30, priority=1).granted is not None
    # a waiter that stopped asking holds nobody up
    leases.withdraw("low-b")
    assert store.database.connect().execute(leases.waiters.select()).all() == []


def waiters_of(store: Store, board: str) -> set[tuple[str, int]]:
    table = store.leases.waiters
    with store.database.connect() as conn:
        rows = conn.execute(table.select().where(table.c.board == board)).all()
    return {(row.holder, row.priority) for row in rows}


@pytest.mark.parametrize("others", [
    [],  # nobody else asks: the holder keeps the board
    [("b", 1)],  # an equal waiting longer: its turn (they alternate)
    [("b", 0)],  # a lower one waits: the holder keeps the board
    [("b", 2), ("c", 1)],  # a higher one goes first
])
def test_a_hand_over_is_a_release_and_a_take_in_one(store: Store,
                                                    others: list[tuple[str, int]]) -> None:
    """``hand_over`` ends as ``release(again)`` followed by ``acquire`` would: on one board
    the pair, on another the hand-over, from the same start."""
    leases, outcome = store.leases, {}
    for board in ("pair", "hand"):
        held = leases.acquire(board, "a", 30, "exp", "a-1", priority=1).granted
        for holder, priority in others:
            assert leases.acquire(board, holder, 30, priority=priority).granted is None
        if board == "pair":
            leases.release(held.lease_id, again=1)
            claim = leases.acquire(board, "a", 30, "exp", "a-2", priority=1)
        else:
            claim = leases.hand_over(held.lease_id, board, "a", 30, "exp", "a-2", priority=1)
        lease = leases.get(board)
        outcome[board] = (claim.granted is not None, claim.current, waiters_of(store, board),
                          lease.holder if lease.expires >= utcnow() else None)
        if claim.granted is not None:  # the new lease is live, the old one is not
            assert (lease.lease_id, lease.run_key) == (claim.granted.lease_id, "a-2")
            assert leases.renew([held.lease_id], 30) == {held.lease_id}
    assert outcome["hand"] == outcome["pair"]
    assert outcome["hand"][0] == (others in ([], [("b", 0)]))


def test_a_hand_over_of_a_lapsed_lease_is_a_plain_take(store: Store) -> None:
    held = store.leases.acquire("board", "a", 1.0).granted
    time.sleep(1.2)
    other = store.leases.acquire("board", "b", 30).granted  # b had it meanwhile
    assert store.leases.hand_over(held.lease_id, "board", "a", 30).granted is None
    store.leases.release(other.lease_id)
    assert store.leases.hand_over(held.lease_id, "board", "a", 30).granted is not None
    assert store.leases.get("board").holder == "a" and waiters_of(store, "board") == set()


def test_a_dead_holders_lease_expires(store: Store) -> None:
    dead = store.leases.acquire("board", "dead", 1.0).granted
    assert store.leases.acquire("board", "alive", 1.0).granted is None
    time.sleep(1.2)
    assert store.leases.active() == []
    taken = store.leases.acquire("board", "alive", 30).granted
    assert taken is not None and taken.holder == "alive"
    assert store.leases.renew([dead.lease_id], 30) == {dead.lease_id}


def test_concurrent_coordinators_never_hold_a_board_together(store_url: str) -> None:
    """Four coordinators (own engines, own connections) fight for one board: at most one holds
    it at any time, each gets turns, and no lock error escapes."""
    Store.open(store_url).close()
    holding: list[str] = []
    overlaps: list[tuple[str, str]] = []
    turns = {name: 0 for name in "ABCD"}
    errors: list[BaseException] = []
    guard = threading.Lock()

    # opened here: Alembic's migration context is not thread-safe
    stores = {name: Store.open(store_url) for name in turns}

    def coordinator(name: str) -> None:
        store = stores[name]
        kept = None  # C and D hand the board from one turn to the next, as the scheduler does
        try:
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                key = f"{name}-{turns[name]}"
                claim = store.leases.hand_over(kept, "board", name, 30, "exp", key) if kept \
                    else store.leases.acquire("board", name, 30, "exp", key)
                kept = None
                if claim.granted is None:
                    time.sleep(0.01)
                    continue
                with guard:
                    overlaps.extend((name, other) for other in holding)
                    holding.append(name)
                time.sleep(0.005)
                with guard:
                    holding.remove(name)
                if name in "CD":
                    kept = claim.granted.lease_id
                else:
                    store.leases.release(claim.granted.lease_id)
                turns[name] += 1
            if kept:
                store.leases.release(kept)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=coordinator, args=(name,)) for name in turns]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert overlaps == []
    assert all(count >= 3 for count in turns.values()), turns


def test_job_queue_order_claim_reclaim_and_cancel(store: Store) -> None:
    jobs = store.jobs
    low = jobs.add("low", "/s/low.toml", "name = 'low'\n", owner="ann")
    high = jobs.add("high", "/s/high.toml", "name = 'high'\n", owner="bob", priority=5)
    other = jobs.add("other", "/s/other.toml", "name = 'other'\n", owner="bob", priority=5)
    one_shot = jobs.add("adhoc", "/s/a.toml", "name = 'adhoc'\n", owner="cy", holder="run-1")
    assert [j.id for j in jobs.list(("queued",))] == [high, other, low]
    claimed = jobs.claim_next("serve-1", stale_after_s=60)
    assert claimed.id == high and claimed.state == "running" and claimed.holder == "serve-1"
    # serve-1 dies: after the stale time its job is queued again and claimed by serve-2, while
    # the vanished one-shot `run` is marked failed (no serve may pick it up)
    time.sleep(1.1)
    again = jobs.claim_next("serve-2", stale_after_s=1)
    assert again.id == high and again.holder == "serve-2"
    assert jobs.get(one_shot).state == "failed"
    jobs.set_totals(high, {"local": 4})
    assert jobs.heartbeat(high) == "running"
    assert jobs.cancel(high, "ann", "cancelled by ann (--force; the owner is bob)")
    assert jobs.heartbeat(high) == "cancelled" and jobs.get(high).cancelled_by == "ann"
    jobs.finish(high, "done", "too late")
    assert jobs.get(high).state == "cancelled" and jobs.get(high).message == "too late"
    assert not jobs.cancel(high, "ann", "again")
    assert jobs.claim_next("serve-2", stale_after_s=60,
                           waits=lambda _conn, job: "busy" if job.id == other else None
                           ).id == low
    # its story: submitted, claimed by serve-1, requeued when serve-1 died, taken over by
    # serve-2, cancelled by ann; every time with its zone
    story = jobs.events(high)
    assert [e.event for e in story] == ["submitted", "claimed", "requeued", "taken over",
                                        "cancelled"]
    assert [e.actor for e in story] == ["bob", "serve-1", "serve-1", "serve-2", "ann"]
    assert "stopped heartbeating" in story[2].cause and "(it was running)" in story[4].cause
    assert all(e.at.tzinfo is not None and e.at.utcoffset().total_seconds() == 0
               for e in story)
    assert [e.event for e in jobs.events(one_shot)] == ["submitted", "claimed", "lost"]
    assert [e.event for e in jobs.events(other)] == ["submitted", "waiting"]


def test_upgrade_from_0002_keeps_runs_and_allows_cancelled(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/old.db"
    database = connect_database(url)
    migrate(database, "0002")
    old = Store(database)
    refs = refs_before_engines(old)
    insert_old_run(database, refs, "old-run")
    old.close()
    with Store.open(url) as store:
        assert [r.run_key for r in store.list_runs()] == ["old-run"]
        store.save_run(sample_result(refs, "cancelled-run", status="cancelled"))
        assert store.get_run("cancelled-run").run["status"] == "cancelled"
        with pytest.raises(IntegrityError), store.database.begin() as conn:
            conn.execute(Measurement.__table__.update().values(status="bogus"))


def test_a_busy_coordinator_keeps_its_job(store: Store) -> None:
    """While the driver builds and plans (no scheduler ticks), a thread heartbeats its job, so
    no `serve` takes it over; once that stops, one does."""
    job = store.jobs.add("busy", "/s/busy.toml", "name = 'busy'\n", owner="ann")
    assert store.jobs.claim_next("serve-1", stale_after_s=60).id == job
    with job_heartbeat(store, job, 0.2):
        time.sleep(1.5)
        assert store.jobs.claim_next("serve-2", stale_after_s=1) is None
    time.sleep(1.2)
    assert store.jobs.claim_next("serve-2", stale_after_s=1).id == job


def test_a_write_waits_for_another_writer_instead_of_failing(sqlite_url: str) -> None:
    """Another process's write transaction holds SQLite's lock until the store's first write
    has asked for it: that write waits for it (BEGIN IMMEDIATE + busy timeout), and ends after
    the other commits, instead of raising "database is locked"."""
    store = Store.open(sqlite_url)
    other = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None,
                            check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO leases (board, lease_id, holder, acquired, heartbeat, expires) "
                  "VALUES ('x', 'l', 'h', '2026-01-01', '2026-01-01', '2026-01-01')")
    begun, committing = threading.Event(), []

    def began(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement == "BEGIN IMMEDIATE":
            begun.set()

    def commit() -> None:
        begun.wait()  # the store's first write transaction asks for the lock
        time.sleep(0.5)  # (and is waiting for it; were it not yet, the proof is weaker only)
        committing.append("committing")  # before the lock is let go: the write cannot end yet
        other.commit()

    event.listen(store.database, "before_cursor_execute", began)
    committer = threading.Thread(target=commit)
    committer.start()
    try:
        refs = add_refs(store)
        store.save_run(sample_result(refs, "waited"))
        saved_after = list(committing)  # the save ended once the other writer committed
    finally:
        committer.join()
        other.close()
    assert saved_after == ["committing"]
    assert store.get_run("waited").run["status"] == "ok"
    assert store.leases.get("x").holder == "h"
    store.close()
