"""Append-only measurements on real stores: retries, reruns, attempts in flight, lost and late
attempts, the measurements reads choose, and the upgrade of older stores (migration 0005)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime, timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from fixtures_db import StoreRefs, insert_old_run, refs_before_engines, sample_result
from sqlalchemy import text

from db import Store
from db.connection import connect_database, migrate
from db.measurements import Selection
from db.models import Base


def count(store: Store, table: str) -> int:
    with store.database.connect() as conn:
        return conn.scalar(text(f"SELECT count(*) FROM {table}"))


def steps(store: Store) -> int:
    """The decode steps stored (packed a measurement to a row)."""
    with store.database.connect() as conn:
        return conn.scalar(text("SELECT coalesce(sum(steps), 0) FROM decode_steps"))


def history(store: Store, key: str) -> list[dict]:
    """Every measurement of the run with its children, as `runs show --json` prints them."""
    return [asdict(m) for m in store.get_run(key).measurements]


def test_a_retry_and_force_reruns_add_measurements_and_never_change_earlier_ones(
        store: Store, refs: StoreRefs) -> None:
    store.save_run(sample_result(refs, "k", status="failed", steps=2))
    first = history(store, "k")
    assert store.completed_run_keys() == set()
    store.save_run(sample_result(refs, "k", steps=3, decode_ms_per_token=10.0))  # the retry
    store.save_run(sample_result(refs, "k", steps=4, decode_ms_per_token=11.0))  # --force
    store.save_run(sample_result(refs, "k", steps=5, decode_ms_per_token=12.0))  # --force
    measured = history(store, "k")
    assert measured[0] == first[0]  # the failed attempt, its children included, unchanged
    assert [m["measurement"]["attempt"] for m in measured] == [1, 2, 3, 4]
    assert [m["measurement"]["status"] for m in measured] == ["failed", "ok", "ok", "ok"]
    assert [len(m["token_timings"]) for m in measured] == [2, 3, 4, 5]
    assert count(store, "runs") == 1 and steps(store) == 14
    assert store.completed_run_keys() == {"k"}
    # reads use the latest ok measurement, or all of them when asked
    detail = store.get_run("k")
    assert detail.run["decode_ms_per_token"] == 12.0 and len(detail.token_timings) == 5
    assert detail.run["measurement_id"] == measured[3]["measurement"]["id"]
    assert store.frames("exp")["runs"]["decode_ms_per_token"].tolist() == [12.0]
    every = store.frames("exp", Selection(all_measurements=True))
    assert every["runs"]["status"].tolist() == ["failed", "ok", "ok", "ok"]
    assert len(every["token_timings"]) == 14 and len(every["outcomes"]) == 4
    (listing,) = store.list_runs("exp")
    assert (listing.status, listing.measurements, listing.revision) == ("ok", 4, "working-tree")
    assert store.experiment_summary("exp").counts["ok"] == 1  # a run counts once


def test_a_failed_rerun_does_not_hide_the_runs_ok_measurement(store: Store,
                                                              refs: StoreRefs) -> None:
    store.save_run(sample_result(refs, "k", decode_ms_per_token=9.0))
    store.save_run(sample_result(refs, "k", status="failed"))
    assert store.get_run("k").run["status"] == "ok"
    assert store.frames("exp")["runs"]["decode_ms_per_token"].tolist() == [9.0]
    assert store.completed_run_keys() == {"k"}


def test_an_attempt_in_flight_is_stored_at_its_start_and_completed_in_place(
        store: Store, refs: StoreRefs) -> None:
    lease = store.leases.acquire("local", "me", 60.0).granted.lease_id
    started = store.start_measurement(sample_result(refs, "k", lease_id=lease, started_at=None))
    assert store.get_run("k").run["status"] == "running"
    assert store.get_run("k").run["started_at"] is not None
    assert store.mark_lost() == 0  # its lease is live
    saved = store.save_run(sample_result(refs, "k", lease_id=lease, steps=3), started)
    assert (saved.measurement_id, saved.lease_expired) == (started, False)
    assert count(store, "measurements") == 1 and store.completed_run_keys() == {"k"}
    with pytest.raises(ValueError, match="not an open attempt"):  # an ok one stays as it is
        store.save_run(sample_result(refs, "k"), started)


def test_an_attempt_whose_lease_lapsed_is_lost_and_its_late_result_is_not_counted(
        store: Store, refs: StoreRefs) -> None:
    """A coordinator stalled (or killed) past its lease: the next one finds its attempt lost;
    a result that still comes is kept as that attempt, marked, and never the run's ok."""
    stalled = store.leases.acquire("local", "a", 60.0).granted.lease_id
    attempt = store.start_measurement(sample_result(refs, "k", lease_id=stalled))
    store.leases.release(stalled)  # as if it had expired
    other = store.leases.acquire("local", "b", 60.0).granted.lease_id
    assert store.mark_lost() == 1
    assert store.get_run("k").run["status"] == "lost"
    store.save_run(sample_result(refs, "k", lease_id=other, decode_ms_per_token=7.0))
    late = store.save_run(sample_result(refs, "k", lease_id=stalled, status="failed"), attempt)
    assert late.lease_expired
    late_ok = store.save_run(sample_result(refs, "k", lease_id=stalled, decode_ms_per_token=99.0))
    assert late_ok.lease_expired
    measured = [m["measurement"] for m in history(store, "k")]
    assert [(m["status"], m["lease_expired"]) for m in measured] == [
        ("failed", True), ("ok", False), ("ok", True)]
    assert store.get_run("k").run["decode_ms_per_token"] == 7.0  # the live holder's result
    assert store.frames("exp")["runs"]["decode_ms_per_token"].tolist() == [7.0]
    assert store.experiment_summary("exp").counts["ok"] == 1


def test_a_time_window_chooses_among_the_measurements_started_in_it(
        store: Store, refs: StoreRefs) -> None:
    day = datetime(2025, 3, 1, 12, 0)
    for n in range(3):
        store.save_run(sample_result(refs, "k", started_at=day + timedelta(days=n),
                                     decode_ms_per_token=10.0 + n))

    def figures(selection: Selection) -> list[float]:
        return store.frames("exp", selection)["runs"]["decode_ms_per_token"].tolist()

    assert figures(Selection(until=day + timedelta(hours=30))) == [11.0]
    assert figures(Selection(since=day + timedelta(hours=30))) == [12.0]
    assert figures(Selection(True, since=day + timedelta(hours=1))) == [11.0, 12.0]
    assert figures(Selection(True, since=day + timedelta(days=9))) == []


def test_the_upgrade_from_0001_keeps_every_run_as_one_measurement(store_url: str) -> None:
    database = connect_database(store_url)
    migrate(database, "0001")  # the oldest schema, rows and children in it
    old = Store(database)
    refs = refs_before_engines(old)
    ok_id = insert_old_run(database, refs, "old-ok", steps=3)
    failed_id = insert_old_run(database, refs, "old-failed", status="failed", steps=0,
                               outcome=None)
    old.close()
    expected = sample_result(refs, "old-ok", steps=3)
    with Store.open(store_url) as store:
        with store.database.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
        ok, failed = store.get_run("old-ok"), store.get_run("old-failed")
        assert (ok.run["id"], failed.run["id"]) == (ok_id, failed_id)
        assert [len(d.measurements) for d in (ok, failed)] == [1, 1]
        measured = ok.measurements[0]
        assert measured.measurement["attempt"] == 1 and not measured.measurement["lease_expired"]
        for name in ("status", "exit_code", "error", "wall_ms", "engine_ms", "decode_ms_per_token",
                     "prompt_tokens", "raw_json"):
            assert measured.measurement[name] == getattr(expected, name), name
        assert measured.token_timings == expected.token_timings
        assert measured.outcome["recall"] == 1.0 and len(measured.snapshots) == 2
        assert failed.run["status"] == "failed" and failed.run["error"] == "lmc: error: boom"
        assert store.completed_run_keys() == {"old-ok"}
        # new measurements go on after the carried ones (ids and attempt numbers)
        store.save_run(sample_result(refs, "old-ok", steps=1))
        assert [m.measurement["attempt"] for m in store.get_run("old-ok").measurements] == [1, 2]
        assert steps(store) == 4
