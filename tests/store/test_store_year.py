"""A year of runs in the store (SQLite, and PostgreSQL when opted in): the raw data packed and
compressed without losing a value (migration 0009 from the oldest schema and from 0008, with
data), each run's current measurement and each experiment's counts per status kept as
measurements land (and equal to what the measurements say), and paged run lists."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta

from fixtures_db import (
    add_refs,
    insert_measured_run,
    insert_old_run,
    refs_before_engines,
    sample_result,
)
from sqlalchemy import func, select, text

from db import Store, TokenTiming
from db.connection import connect_database, migrate
from db.measurements import current_rule
from db.models import ExperimentCount, ExperimentRun, Measurement, Run
from db.packing import pack_steps, unpack_steps
from db.records import RUN_STATUSES, Snapshot
from reports.runs import load_experiment


def kept_counts(store: Store, experiment_id: int) -> dict[str, int]:
    with store.database.connect() as conn:
        return {s: n for s, n in conn.execute(
            select(ExperimentCount.status, ExperimentCount.runs)
            .where(ExperimentCount.experiment_id == experiment_id)) if n}


def derived_counts(store: Store, experiment_id: int) -> dict[str, int]:
    """The counts per status from the measurements themselves, by the reads' rule."""
    with store.database.connect() as conn:
        current = (select(Measurement.run_id, current_rule().label("id"))
                   .group_by(Measurement.run_id).subquery())
        rows = conn.execute(
            select(Measurement.status, func.count())
            .join(current, current.c.id == Measurement.id)
            .join(ExperimentRun, ExperimentRun.run_id == current.c.run_id)
            .where(ExperimentRun.experiment_id == experiment_id)
            .group_by(Measurement.status)).all()
    return dict(rows)


def test_steps_pack_and_unpack_to_the_same_values() -> None:
    steps = [TokenTiming(0, 7, 12.345678901234, None), TokenTiming(1, 2**31 - 1, 0.1, 3.25),
             TokenTiming(2, 0, 1e-300, 0.0)]
    packed = pack_steps(steps)
    assert packed["steps"] == 3 and len(packed["ms"]) == 24
    assert unpack_steps(packed["tokens"], packed["ms"], packed["attn_ms"]) == steps
    none = pack_steps([TokenTiming(0, 1, 2.0)])
    assert none["attn_ms"] is None
    assert unpack_steps(none["tokens"], none["ms"], None) == [TokenTiming(0, 1, 2.0, None)]


def test_the_upgrade_from_0008_keeps_every_value_and_fills_what_is_kept(store_url: str) -> None:
    database = connect_database(store_url)
    migrate(database, "0008")
    old = Store(database)
    refs = refs_before_engines(old)
    long_doc = '{"schema": "lmc/1", "steps": [' + ", ".join(["1.5"] * 3000) + "]}"
    retried = [sample_result(refs, "retried", status="failed", steps=0, outcome=None),
               sample_result(refs, "retried", steps=5, raw_json=long_doc),
               replace(sample_result(refs, "retried", status="running", steps=0,
                                     outcome=None, snapshots=[]), raw_json=None)]
    odd = sample_result(refs, "odd", token_timings=[TokenTiming(0, 5, 1.0, None),
                                                     TokenTiming(1, 6, 2.0, 0.5)],
                        snapshots=[Snapshot("before", {"nested": {"deep": [1, 2.5, None]},
                                                       "text": "ü\n"}, None)])
    insert_measured_run(database, refs, "retried", results=retried)
    insert_measured_run(database, refs, "odd", results=[odd])
    insert_measured_run(database, refs, "lone", status="pending", steps=0, outcome=None)
    old.close()
    with Store.open(store_url) as store:
        detail = store.get_run("retried")
        assert detail.run["status"] == "ok" and detail.run["attempts"] == 3
        assert detail.run["current_measurement_id"] == detail.measurements[1].measurement["id"]
        assert detail.measurements[1].measurement["raw_json"] == long_doc
        assert detail.measurements[2].measurement["raw_json"] is None
        assert detail.token_timings == retried[1].token_timings
        assert [s["fingerprint"] for s in detail.snapshots] == \
            [s.fingerprint for s in retried[1].snapshots]
        shown = store.get_run("odd")
        assert shown.token_timings == odd.token_timings
        assert shown.snapshots[0]["fingerprint"] == odd.snapshots[0].fingerprint
        assert kept_counts(store, refs.experiment_id) == {"ok": 2, "pending": 1}
        assert derived_counts(store, refs.experiment_id) == {"ok": 2, "pending": 1}
        frames = store.frames("exp")
        assert frames["token_timings"]["step"].tolist() == [0, 1, 2, 3, 4, 0, 1]
        attn = frames["token_timings"]["attn_ms"].tolist()
        assert attn[:5] == [3.0] * 5 and math.isnan(attn[5]) and attn[6] == 0.5
        with store.database.connect() as conn:
            assert "token_timings" not in conn.dialect.get_table_names(conn)


def test_the_upgrade_from_0001_carries_the_old_steps_into_packed_rows(store_url: str) -> None:
    database = connect_database(store_url)
    migrate(database, "0001")
    old = Store(database)
    refs = refs_before_engines(old)
    insert_old_run(database, refs, "oldest", steps=6)
    old.close()
    with Store.open(store_url) as store:
        detail = store.get_run("oldest")
        assert detail.token_timings == sample_result(refs, "oldest", steps=6).token_timings
        assert (detail.run["status"], detail.run["attempts"]) == ("ok", 1)
        assert kept_counts(store, refs.experiment_id) == {"ok": 1}


def test_the_upgrade_to_0016_summarises_every_stored_snapshot(store_url: str) -> None:
    """A report reads each snapshot's summary (flags, CPU, load), not its fingerprint: the
    upgrade fills it for the snapshots already stored (db.rows.snapshot_summary)."""
    database = connect_database(store_url)
    migrate(database, "0008")
    old = Store(database)
    refs = refs_before_engines(old)
    # taken before fingerprints carried flags, on a loaded machine short of memory; the old
    # schema named the CPU "cpu"
    busy = {"loadavg": [3.5, 2.0, 1.0], "mem_total_kb": 4000000, "mem_available_kb": 100000,
            "cpu": "Old Xeon", "kernel": "5.4"}
    # carrying the judgement made when it was taken, and today's CPU facts
    judged = {"flags": ["throttling"], "cpu_model": "Cortex-A76", "cpu_id": "ARM 0x41 0xd0b",
              "loadavg": [0.1, 0.2, 0.3], "kernel": "6.1", "cores": [{"cpu": 0}]}
    insert_measured_run(database, refs, "busy", snapshots=[Snapshot("before", busy, None),
                                                           Snapshot("after", busy, None)])
    insert_measured_run(database, refs, "judged", snapshots=[Snapshot("before", judged, None)])
    old.close()
    with Store.open(store_url) as store:
        snapshots = store.frames("exp", summaries=True)["snapshots"]
        assert "fingerprint" not in snapshots
        # the unjudged one keeps what its judgement reads; the judged one, its judgement
        assert snapshots["summary"].tolist() == [
            {key: busy[key] for key in ("cpu", "loadavg", "mem_total_kb", "mem_available_kb")},
        ] * 2 + [{"flags": ["throttling"], "cpu_model": "Cortex-A76",
                  "cpu_id": "ARM 0x41 0xd0b", "loadavg": [0.1, 0.2, 0.3]}]
        data = load_experiment(store, "exp")  # the load only counts before the run
        assert data.runs["flags"].tolist() == ["loaded; low-memory", "throttling"]
        assert data.runs["cpu"].tolist() == ["Old Xeon", "Cortex-A76 (ARM 0x41 0xd0b)"]
        # the device's facts come from its first snapshot, read whole
        assert data.device_fingerprints == {"local": busy}


def test_counts_follow_every_kind_of_write(store: Store) -> None:
    refs = add_refs(store)
    other = store.upsert_experiment("other", "name = 'other'\n", "h2")
    running = store.start_measurement(sample_result(refs, "a"))
    assert kept_counts(store, refs.experiment_id) == {"running": 1}
    store.save_run(sample_result(refs, "a", status="failed"), running)
    store.save_run(sample_result(refs, "b"))
    store.save_run(sample_result(refs, "c", status="failed"))
    store.save_run(sample_result(refs, "c"))  # a retry that went ok
    store.save_run(sample_result(refs, "b", status="failed"))  # a failed rerun: b stays ok
    expected = {"failed": 1, "ok": 2}
    assert kept_counts(store, refs.experiment_id) == expected
    assert store.link_runs(other, ["b", "c", "missing"]) == {"missing"}
    store.link_runs(other, ["b"])  # linking twice counts once
    assert kept_counts(store, other) == {"ok": 2}
    # an attempt in flight whose coordinator died: found lost
    store.start_measurement(sample_result(refs, "d", lease_id="gone"))
    assert store.mark_lost() == 1
    expected["lost"] = 1
    assert kept_counts(store, refs.experiment_id) == expected
    for experiment in (refs.experiment_id, other):
        assert kept_counts(store, experiment) == derived_counts(store, experiment)
    summary = store.experiment_summary("exp")
    assert {s: n for s, n in summary.counts.items() if n} == expected
    assert set(summary.counts) == set(RUN_STATUSES)


def test_runs_are_listed_a_page_at_a_time(store: Store) -> None:
    refs = add_refs(store)
    for i in range(7):
        store.save_run(sample_result(refs, f"r{i}", status="failed" if i % 3 == 0 else "ok"))
    pages = [[r.run_key for r in store.list_runs("exp", limit=3, offset=start)]
             for start in (0, 3, 6)]
    assert pages == [["r0", "r1", "r2"], ["r3", "r4", "r5"], ["r6"]]
    assert [r.run_key for r in store.list_runs("exp", "failed", limit=2, offset=1)] == \
        ["r3", "r6"]
    assert store.count_runs("exp") == 7 and store.count_runs("exp", "failed") == 3
    assert store.count_runs(None, "ok") == 4 and store.count_runs() == 7


def test_what_is_kept_on_a_run_equals_what_its_measurements_say(store: Store) -> None:
    refs = add_refs(store)
    start = sample_result(refs, "x").started_at
    for i, status in enumerate(("failed", "ok", "failed", "ok", "lost")):
        store.save_run(sample_result(refs, "x", status=status,
                                     started_at=start + timedelta(minutes=i)))
    with store.database.connect() as conn:
        kept = conn.execute(select(Run.current_measurement_id, Run.status, Run.attempts)).one()
        rule = conn.scalar(select(current_rule()).where(Measurement.run_id == 1))
        count = conn.scalar(text("SELECT count(*) FROM measurements"))
    assert kept == (rule, "ok", count) and not math.isnan(rule)


def test_a_batch_of_results_is_stored_as_one_by_one_would_store_it(store: Store) -> None:
    refs = add_refs(store)
    one, batch = [], []
    for i, status in enumerate(("ok", "failed", "ok", "lost")):
        one.append(sample_result(refs, f"one-{i % 2}", status=status, steps=i))
        batch.append(sample_result(refs, f"batch-{i % 2}", status=status, steps=i))
    for result in one:
        store.save_run(result)
    saved = store.save_runs(batch)
    assert [s.run_id for s in saved] == [saved[0].run_id, saved[1].run_id] * 2
    for i in range(2):
        a, b = store.get_run(f"one-{i}"), store.get_run(f"batch-{i}")
        for key in ("status", "attempts", "decode_ms_per_token"):
            assert a.run[key] == b.run[key], key
        assert [m.token_timings for m in a.measurements] == \
            [m.token_timings for m in b.measurements]
    assert kept_counts(store, refs.experiment_id) == derived_counts(store, refs.experiment_id)


def test_the_experiment_mark_changes_with_every_write_to_its_runs(store: Store) -> None:
    """The mark (a cache key of what an experiment shows, read without reading its runs)
    changes when a run is added, an attempt starts or ends (even one that leaves the run's
    status as it was), a run joins the experiment or an attempt is found lost; a write to
    another experiment's runs leaves it as it was."""
    refs = add_refs(store)
    other = replace(refs, experiment_id=store.upsert_experiment("other", "x", "h2"))
    marks = [store.experiment_mark("exp")]

    def changed() -> bool:
        marks.append(store.experiment_mark("exp"))
        return marks[-1] != marks[-2]

    store.save_run(sample_result(refs, "a"))
    assert changed()
    rerun = store.start_measurement(sample_result(refs, "a"))  # a is still ok: counts stay
    assert changed()
    store.save_run(sample_result(refs, "a", decode_ms_per_token=11.0), rerun)
    assert changed()
    store.save_run(sample_result(other, "z"))
    assert not changed()
    store.link_runs(refs.experiment_id, ["z"])
    assert changed()
    store.start_measurement(sample_result(refs, "d", lease_id="gone"))
    assert changed()
    store.mark_lost()
    assert changed()
    assert len(set(marks)) == len(marks) - 1  # every change a new mark
