"""The result store on real SQLite files: schema, round trips, run keys, transactions."""

from __future__ import annotations

import dataclasses
import sqlite3
from dataclasses import asdict, replace

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from fixtures_db import (
    BUILD_RECORD,
    add_refs,
    insert_measured_run,
    insert_old_run,
    refs_before_engines,
    sample_result,
)
from sqlalchemy import MetaData, Table, inspect, select, text
from sqlalchemy.exc import IntegrityError

from db import Store, StoreError, StoreInputError, TokenTiming, timings_from_steps
from db.connection import connect_database, head_revision, migrate
from db.models import RUN_KEPT, Base, DeviceSnapshot, Measurement, OutcomeRow, Run
from db.records import Outcome, RunResult, Snapshot
from db.rows import KEY_CHUNK, MEASUREMENT_FIELDS, RUN_FIELDS

TABLES = {"experiments", "devices", "device_snapshots", "builds", "models", "workloads", "runs",
          "decode_steps", "outcomes", "experiment_runs", "experiment_counts", "leases", "jobs",
          "board_states", "board_events", "health_checks", "reservations", "measurements",
          "board_waiters", "step_results", "users", "audit_events", "job_events",
          "build_revisions", "alerts", "alert_steps", "alert_changes"}


def count(store: Store, table: str) -> int:
    with store.database.connect() as conn:
        return conn.scalar(text(f"SELECT count(*) FROM {table}"))


def steps(store: Store) -> int:
    """The decode steps stored (packed a measurement to a row)."""
    with store.database.connect() as conn:
        return conn.scalar(text("SELECT coalesce(sum(steps), 0) FROM decode_steps"))


def test_migrations_create_the_schema_of_the_models(store_url: str) -> None:
    store = Store.open(store_url)
    with store.database.connect() as conn:
        assert set(inspect(conn).get_table_names()) == TABLES | {"alembic_version"}
        assert conn.scalar(text("SELECT version_num FROM alembic_version")) == head_revision()
        # The hand-written migration and the ORM classes describe the same schema.
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    store.close()
    with Store.open(store_url) as again:  # reopening an up-to-date file changes nothing
        assert count(again, "alembic_version") == 1


def test_sqlite_runs_in_wal_mode_with_foreign_keys(sqlite_url: str) -> None:
    with Store.open(sqlite_url) as store, store.database.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
    # WAL is a property of the file: a plain sqlite3 connection sees it too.
    raw = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    raw.close()


def test_save_run_round_trip(store: Store, refs) -> None:
    result = sample_result(refs, "key-1", steps=6)
    run_id = store.save_run(result).run_id
    detail = store.get_run("key-1")
    assert detail.run["id"] == run_id and store.get_run(str(run_id)).run["run_key"] == "key-1"
    for name in ("command", "policy", "k", "block", "probes", "kv", "wq", "threads",
                 "prefill_attn", "repeat", "status", "exit_code", "wall_ms", "engine_ms",
                 "overhead_ms", "prefill_ms", "decode_ms_per_token", "attn_ms_per_token",
                 "prompt_tokens", "raw_json", "config"):
        assert detail.run[name] == getattr(result, name), name
    # Aware timestamps are stored as naive UTC.
    assert detail.run["started_at"] == result.started_at.replace(tzinfo=None)
    assert detail.token_timings == result.token_timings
    outcome = {k: v for k, v in detail.outcome.items() if k != "measurement_id"}
    assert outcome == asdict(result.outcome)
    assert [(s["phase"], s["fingerprint"]) for s in detail.snapshots] == [
        (s.phase, s.fingerprint) for s in result.snapshots]
    assert detail.experiment == "exp" and detail.device["name"] == "local"
    assert detail.build["binary_sha256"] == BUILD_RECORD["binary_sha256"]
    assert detail.workload["ids"] == [1, 2, 3, 4] and detail.workload["needle_span"] == [1, 3]
    assert detail.model["config"] == {"hidden_size": 64}


def test_reference_upserts_return_the_same_row(store: Store, refs) -> None:
    again = add_refs(store)
    assert again == refs
    assert store.upsert_device("local", "x86_64", "x86", True, {"host": "h2"}) == refs.device_id
    assert count(store, "devices") == 1
    other = store.record_build({**BUILD_RECORD, "target": "aarch64"})
    assert other != refs.build_id and count(store, "builds") == 2
    assert store.upsert_workload("needle", {}, "w" * 16, [9]) == refs.workload_id


def test_record_build_takes_a_harness_build_record(store: Store) -> None:
    from harness.engines.lmc.build import BuildRecord

    record = BuildRecord(**{k: v for k, v in BUILD_RECORD.items()})
    build_id = store.record_build(asdict(record))
    assert store.record_build(asdict(record)) == build_id


def test_the_database_refuses_a_second_row_per_key(store: Store, refs) -> None:
    store.save_run(sample_result(refs, "k"))
    row = {c: v for c, v in store.get_run("k").run.items()
           if c in Run.__table__.columns and c != "id"}
    with pytest.raises(IntegrityError), store.database.begin() as conn:
        conn.execute(Run.__table__.insert().values(**row))
    assert count(store, "runs") == 1


def test_an_error_mid_save_leaves_nothing_written(store: Store, refs) -> None:
    # Decode steps out of order are refused after the run and measurement rows were written.
    bad = sample_result(refs, "k", steps=3)
    bad.token_timings.append(TokenTiming(step=0, token=1, ms=1.0))
    with pytest.raises(ValueError, match="decode steps must be numbered"):
        store.save_run(bad)
    assert all(count(store, t) == 0
               for t in ("runs", "measurements", "decode_steps", "outcomes", "device_snapshots"))
    # A failing second measurement leaves the first and its children as they were.
    store.save_run(sample_result(refs, "k", status="failed", steps=2))
    with pytest.raises(ValueError):
        store.save_run(replace(bad, outcome=None))
    assert store.get_run("k").run["status"] == "failed" and steps(store) == 2
    assert count(store, "measurements") == 1


def test_invalid_status_is_refused_before_writing(store: Store, refs) -> None:
    with pytest.raises(ValueError, match="allowed ok, failed"):
        store.save_run(sample_result(refs, "k", status="done"))
    assert count(store, "runs") == 0


def test_completed_run_keys_filters_by_status_and_keys(store: Store, refs) -> None:
    statuses = ["ok", "failed", "interrupted", "pending"] * 3
    for i, status in enumerate(statuses):
        store.save_run(sample_result(refs, f"k{i}", status=status, steps=1))
    ok = {f"k{i}" for i, s in enumerate(statuses) if s == "ok"}
    assert store.completed_run_keys() == ok
    asked = [f"k{i}" for i in range(KEY_CHUNK * 2 + 7)]  # more keys than one IN (...) holds
    assert store.completed_run_keys(asked) == ok
    assert store.completed_run_keys(["k0", "k1", "nope"]) == {"k0"}
    assert store.completed_run_keys([]) == set()


def test_queries_and_frames_cover_one_experiment(store: Store, refs) -> None:
    other = add_refs(store, experiment="other", device="rk1")
    store.save_run(sample_result(refs, "a", steps=3))
    store.save_run(sample_result(refs, "b", steps=4, decode_ms_per_token=14.5, repeat=1))
    store.save_run(sample_result(refs, "c", status="failed", steps=0, outcome=None))
    store.save_run(sample_result(other, "d", steps=5))

    assert store.list_experiments() == ["exp", "other"]
    assert [r.run_key for r in store.list_runs()] == ["a", "b", "c", "d"]
    assert [r.run_key for r in store.list_runs("exp", "failed")] == ["c"]
    listing = store.list_runs("other")[0]
    assert (listing.device, listing.recall, listing.status) == ("rk1", 1.0, "ok")

    summary = store.experiment_summary("exp")
    assert summary.counts == {"ok": 2, "failed": 1, "interrupted": 0, "pending": 0,
                              "cancelled": 0, "running": 0, "lost": 0}
    assert summary.total == 3 and summary.devices == {"local": summary.counts}
    (group,) = summary.groups
    assert (group.runs, group.decode_ms_per_token, group.recall) == (2, 13.5, 1.0)

    frames = store.frames("exp")
    runs = frames["runs"]
    assert list(runs["run_key"]) == ["a", "b", "c"]
    assert {"experiment", "device_name", "device_emulated", "build_binary_sha256",
            "model_sha256", "workload_content_hash", "workload_answer"} <= set(runs.columns)
    assert set(runs["device_name"]) == {"local"} and set(runs["experiment"]) == {"exp"}
    assert runs.loc[0, "config"] == '{"attn": "sparse", "k": 4, "threads": 2}'
    timings = frames["token_timings"]
    assert len(timings) == 7 and list(timings["step"][:3]) == [0, 1, 2]
    assert len(frames["outcomes"]) == 2 and len(frames["snapshots"]) == 6
    assert frames["outcomes"].loc[0, "generated_ids"] == "[100, 101, 102]"


def test_get_run_accepts_a_unique_key_prefix(store: Store, refs) -> None:
    store.save_run(sample_result(refs, "abcdef111"))
    store.save_run(sample_result(refs, "abcdef222"))
    assert store.get_run("abcdef2").run["run_key"] == "abcdef222"
    with pytest.raises(StoreInputError, match="matches several runs"):
        store.get_run("abcdef")
    with pytest.raises(StoreInputError, match="no run with id or key 'abc'"):
        store.get_run("abc")  # too short to be taken as a prefix
    with pytest.raises(StoreInputError, match="no run"):
        store.get_run("abcde%")  # LIKE wildcards are taken literally


def test_unknown_names_are_input_errors(store: Store, refs) -> None:
    with pytest.raises(StoreInputError, match="no experiment named 'nope'.*known: exp"):
        store.frames("nope")
    with pytest.raises(StoreInputError, match="no run with id or key '42'"):
        store.get_run(42)
    with pytest.raises(StoreInputError, match="allowed ok, failed"):
        store.list_runs(status="weird")


@pytest.mark.parametrize("url, message", [
    ("not a url", "is not a SQLAlchemy URL"),
    ("nosuchdb://host/db", "cannot use this database driver"),
    ("sqlite:////nonexistent-dir/x.db", "directory /nonexistent-dir does not exist"),
])
def test_bad_urls_are_input_errors(url: str, message: str) -> None:
    with pytest.raises(StoreInputError, match=message) as caught:
        Store.open(url)
    assert caught.value.exit_code == 2


def test_a_file_that_is_not_a_database_is_an_input_error(tmp_path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are not the rows you are looking for\n" * 100)
    with pytest.raises(StoreInputError, match="cannot open the result store"):
        Store.open(f"sqlite:///{path}")


def test_a_schema_from_a_newer_benchfarm_is_refused(store: Store, store_url: str) -> None:
    with store.database.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(StoreError, match="cannot be upgraded") as caught:
        Store.open(store_url)
    assert caught.value.exit_code == 1


def test_timings_from_engine_steps() -> None:
    steps = [{"token": 5, "ms": 1.5, "attn_ms": 0.5}, {"token": 6, "ms": 2}]
    assert timings_from_steps(steps) == [TokenTiming(0, 5, 1.5, 0.5), TokenTiming(1, 6, 2.0)]


def test_session_rolls_back_on_error(store: Store) -> None:
    with pytest.raises(RuntimeError), store.session() as session:
        session.execute(text("INSERT INTO experiments (name, spec_text, spec_hash, created_at, "
                             "updated_at) VALUES ('x', '', '', '2025-01-01', '2025-01-01')"))
        raise RuntimeError("abort")
    with store.session() as session:
        assert session.scalars(select(Run)).all() == [] and count(store, "experiments") == 0


def test_a_run_shared_by_two_experiments_belongs_to_both(store: Store, refs) -> None:
    other = add_refs(store, experiment="other")
    store.save_run(sample_result(refs, "shared", steps=2))
    store.save_run(sample_result(other, "own", steps=3))
    # "other" finds "shared" done (run keys do not name the experiment) and links it.
    assert store.completed_run_keys(["shared", "own"]) == {"shared", "own"}
    assert store.link_runs(other.experiment_id, ["shared", "never"]) == {"never"}
    assert store.link_runs(other.experiment_id, ["shared"]) == set()  # idempotent
    assert [r.run_key for r in store.list_runs("other")] == ["shared", "own"]
    assert [r.run_key for r in store.list_runs("exp")] == ["shared"]
    assert store.experiment_summary("other").counts["ok"] == 2
    frames = store.frames("other")
    assert list(frames["runs"]["run_key"]) == ["shared", "own"]
    assert set(frames["runs"]["experiment"]) == {"other"} and len(frames["token_timings"]) == 5
    # Saving it again (--force in "other") keeps it in both experiments.
    store.save_run(sample_result(other, "shared", steps=4))
    assert [r.run_key for r in store.list_runs("exp")] == ["shared"]
    assert count(store, "experiment_runs") == 3



def test_upgrade_from_0001_links_existing_runs(sqlite_url: str) -> None:
    database = connect_database(sqlite_url)
    migrate(database, "0001")
    old = Store(database)  # the 0001 schema: no experiment_runs yet
    refs = refs_before_engines(old)
    insert_old_run(database, refs, "old-run")
    old.close()
    with Store.open(sqlite_url) as store:
        assert [r.run_key for r in store.list_runs("exp")] == ["old-run"]
        assert store.frames("exp")["runs"]["run_key"].tolist() == ["old-run"]


def test_upgrade_from_0002_marks_existing_builds_and_runs_as_lmc(sqlite_url: str) -> None:
    database = connect_database(sqlite_url)
    migrate(database, "0002")
    old = Store(database)  # the 0002 schema: no engine columns
    with database.connect() as conn:
        assert "engine" not in {c["name"] for c in inspect(conn).get_columns("runs")}
    refs = refs_before_engines(old)
    insert_old_run(database, refs, "old-run")
    old.close()
    with Store.open(sqlite_url) as store, store.database.connect() as conn:
        assert conn.execute(text("SELECT engine FROM runs")).scalars().all() == ["lmc"]
        assert conn.execute(text("SELECT engine FROM builds")).scalars().all() == ["lmc"]
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []


def test_upgrade_from_0007_adds_the_memory_figures_empty(sqlite_url: str) -> None:
    database = connect_database(sqlite_url)
    migrate(database, "0007")
    old = Store(database)  # the 0007 schema: outcomes without the memory columns
    refs = refs_before_engines(old)
    run_id = insert_measured_run(database, refs, "old-run", outcome=None)
    with database.begin() as conn:
        outcomes = Table("outcomes", MetaData(), autoload_with=conn)
        assert "peak_rss_kb" not in outcomes.columns
        measurement_id = conn.scalar(text(f"SELECT id FROM measurements WHERE run_id = {run_id}"))
        conn.execute(outcomes.insert().values(measurement_id=measurement_id, recall=1.0,
                                              extra={"peak_rss_kb": 900}))
    old.close()
    with Store.open(sqlite_url) as store, store.database.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
        outcome = store.get_run("old-run").measurements[0].outcome
        assert (outcome["recall"], outcome["extra"]) == (1.0, {"peak_rss_kb": 900})
        assert [outcome[c] for c in ("peak_rss_kb", "kv_allocated_bytes",
                                     "kv_resident_bytes")] == [None] * 3
        store.save_run(sample_result(refs, "new-run"))  # the new columns take big counts
        assert store.get_run("new-run").measurements[0].outcome["kv_allocated_bytes"] == \
            5 * 2**32


@pytest.mark.parametrize("stamped, migrated_to", [("0003b", "0003"), ("0005", "0004")])
def test_a_store_stamped_with_a_renamed_revision_opens_and_upgrades(
        sqlite_url: str, stamped: str, migrated_to: str) -> None:
    """Stores migrated before the revisions were renumbered 0001-0004 hold the old ids."""
    database = connect_database(sqlite_url)
    migrate(database, migrated_to)
    with database.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = :old"), {"old": stamped})
    database.dispose()
    with Store.open(sqlite_url) as store, store.database.connect() as conn:
        assert conn.scalar(text("SELECT version_num FROM alembic_version")) == head_revision()
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []


def test_a_stored_run_has_one_definition() -> None:
    """The record the coordinator fills and the tables it is stored in name the same fields: a
    field added to one and not the other would be silently not stored, or fail every write."""
    def fields(record: type) -> set[str]:
        return {f.name for f in dataclasses.fields(record)}

    def columns(table: type, *keys: str) -> set[str]:
        return {c.name for c in table.__table__.columns} - set(keys)

    children = {"token_timings", "outcome", "snapshots"}  # stored in their own tables
    store_own = ("id", "run_id", "attempt", "lease_expired")  # what the store decides
    derived = ("summary",)  # of a snapshot's fingerprint, by the store
    assert columns(Run, "id", *RUN_KEPT) == set(RUN_FIELDS)
    assert columns(Measurement, *store_own) == set(MEASUREMENT_FIELDS)
    assert fields(RunResult) - children == set(RUN_FIELDS) | set(MEASUREMENT_FIELDS)
    assert not set(RUN_FIELDS) & set(MEASUREMENT_FIELDS)
    assert fields(Outcome) == columns(OutcomeRow, "measurement_id")
    assert fields(Snapshot) == columns(DeviceSnapshot, "id", "measurement_id", *derived)


def test_schema_changes_are_transactional(store: Store) -> None:
    # Migrations rely on it: an interrupted upgrade must not leave half a schema behind.
    with pytest.raises(RuntimeError), store.database.begin() as conn:
        conn.execute(text("CREATE TABLE half_done (id INTEGER)"))
        raise RuntimeError("killed mid-migration")
    with store.database.connect() as conn:
        assert "half_done" not in inspect(conn).get_table_names()
