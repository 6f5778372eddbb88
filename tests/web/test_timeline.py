"""The per-board timeline of the last 24 hours, laid out from what the store read: busy spans
name their job, a state other than online and a reservation show as such, the rest is idle,
and the spans cover the window without gaps."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from fixtures_reports import SyntheticExperiment
from fixtures_web import serving
from sqlalchemy import update
from test_web import get, get_json

from db.board_days import Attempt, BoardDays, JobSpan, Kept
from db.leases import utcnow
from db.models import Job, Measurement
from db.store import Store
from harness.web.timeline import timelines

NOW = datetime(2026, 12, 5, 12, 0)


def at(hours_ago: float) -> datetime:
    return NOW - timedelta(hours=hours_ago)


def test_a_boards_day_in_spans() -> None:
    days = BoardDays(
        attempts=[Attempt("x86-1", "needle", at(10), at(9)),
                  Attempt("x86-1", "needle", at(9), at(8)),  # back to back: one span
                  Attempt("x86-1", "other", at(3), None),  # still running
                  Attempt("arm-1", "old", at(30), at(23))],  # began before the window
        changes=[("x86-1", "maintenance", at(6)), ("x86-1", "online", at(5)),
                 ("arm-1", "bad", at(2))],
        reservations=[Kept("arm-1", "bo", at(20), at(12))],
        jobs=[JobSpan(7, "needle", at(11), at(7.5)), JobSpan(8, "old", at(31), at(22))])
    x86, arm = timelines(days, ["x86-1", "arm-1"], NOW)
    assert [(s.kind, s.label, s.start, s.end) for s in x86.spans] == [
        ("idle", "idle", at(24), at(10)),
        ("busy", "job 7 (needle)", at(10), at(8)),
        ("idle", "idle", at(8), at(6)),
        ("maintenance", "maintenance", at(6), at(5)),
        ("idle", "idle", at(5), at(3)),
        ("busy", "other", at(3), NOW)]  # no job of that experiment was running: no job
    assert x86.spans[1].job == 7 and x86.spans[-1].job is None
    assert [(s.kind, s.start, s.end) for s in arm.spans] == [
        ("busy", at(24), at(23)), ("idle", at(23), at(20)), ("reserved", at(20), at(12)),
        ("idle", at(12), at(2)), ("bad", at(2), NOW)]
    assert arm.spans[0].label == "job 8 (old)" and arm.spans[2].label == "reserved by bo"


def test_the_wall_shows_each_boards_day(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/day.db"
    store = Store.open(url)
    exp = SyntheticExperiment(store, name="day", spec_text='name = "day"\n')
    job = store.jobs.add("day", "day.toml", exp.spec_text, owner="ana", holder="host:1:abc")
    exp.run(device="x86-1")
    with store.database.begin() as conn:  # the run took the last hour, in a job of two hours
        conn.execute(update(Measurement).values(started_at=utcnow() - timedelta(hours=1)))
        conn.execute(update(Job).values(started_at=utcnow() - timedelta(hours=2)))
    store.boards.set_state("arm-1", "maintenance", "fan", "ana")
    store.boards.reserve("spare-1", "bo", utcnow() + timedelta(hours=2), "demo")
    store.close()
    with serving(url) as base:
        found = {t["board"]: t["spans"] for t in get_json(f"{base}/api/timeline")}
        status, page = get(f"{base}/")
    assert {s["kind"] for s in found["arm-1"]} == {"idle", "maintenance"}
    assert found["arm-1"][-1]["kind"] == "maintenance"
    assert found["spare-1"][-1]["kind"] == "reserved"
    busy = [s for s in found["x86-1"] if s["kind"] == "busy"]
    assert [s["job"] for s in busy] == [job]
    timeline = page[page.index('<div id="timeline">'):]
    assert status == 200 and f'data-kind="busy" data-job="{job}"' in timeline
    assert 'data-board="arm-1"' in timeline and 'data-kind="maintenance"' in timeline
