"""A job's story and counts: `status` and `status JOB` count alike, a queued job's cancel is
announced, the events of jobs stored before events existed, serve's UTC stamps."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest
from fixtures_notify import Receiver
from fixtures_reports import SyntheticExperiment
from sqlalchemy import insert

from db.connection import connect_database, migrate
from db.leases import utcnow
from db.models import Job
from db.store import Store
from harness.cli import main
from harness.execution.notify import flush
from harness.lab.stamped import Stamped, utc_stamp


def _table_row(out: str, first: str) -> list[str]:
    [row] = [line.split() for line in out.splitlines() if line.split()[:1] == [first]]
    return row


def test_status_and_status_job_give_the_same_counts(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/counts.db"
    with Store.open(url) as store:
        exp = SyntheticExperiment(store)
        job = store.jobs.add("synthetic", "/s.toml", 'name = "synthetic"\n', owner="ann")
        store.jobs.claim_next("serve-1", stale_after_s=60)
        store.jobs.set_totals(job, {"local": 6})  # 3 of its 6 runs stored so far
        for repeat, status in enumerate(("ok", "ok", "interrupted")):
            exp.run(repeat=repeat, status=status, job_id=job)
    assert main(["--db", url, "status"]) == 0
    listed = _table_row(capsys.readouterr().out, "synthetic")
    assert main(["--db", url, "status", str(job)]) == 0
    out = capsys.readouterr().out
    # experiment runs ok failed interrupted pending cancelled running lost | not started
    assert listed[1:10] == ["3", "2", "0", "1", "0", "0", "0", "0", "3"]
    assert "3 runs: 2 ok, 0 failed, 1 interrupted, 0 pending" in out
    # board matrix ok failed interrupted pending cancelled running lost not started
    assert _table_row(out.split("its matrix per board")[1], "local") == [
        "local", "6", "2", "0", "1", "0", "0", "0", "0", "3"]


def test_a_rerun_job_counts_its_own_runs_not_its_experiments(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two jobs of one experiment: the first ran 5 runs, the second (an extension) was given 2
    and ran one ok and one failed; each counts its own, so done never exceeds its total."""
    url = f"sqlite:///{tmp_path}/rerun.db"
    with Store.open(url) as store:
        exp, jobs = SyntheticExperiment(store), store.jobs
        first = jobs.add("synthetic", "/s.toml", 'name = "synthetic"\n', owner="ann")
        jobs.claim_next("serve-1", stale_after_s=60)
        jobs.set_totals(first, {"local": 5})
        for repeat in range(5):
            exp.run(repeat=repeat, job_id=first)
        jobs.finish(first, "done", "5 ok")
        second = jobs.add("synthetic", "/s.toml", 'name = "synthetic"\n', owner="bob")
        jobs.claim_next("serve-1", stale_after_s=60)
        jobs.set_totals(second, {"local": 2})
        exp.run(repeat=5, job_id=second)
        exp.run(repeat=6, status="failed", job_id=second)
        jobs.set_totals(second, {"local": 1})  # a resume plans what is left: the total stays
        [one] = jobs.progress("synthetic", jobs.get(first))
        [two] = jobs.progress("synthetic")  # the newest job's
    assert (one.total, one.done, one.failed, one.pending) == (5, 5, 0, 0)
    assert (two.total, two.done, two.failed, two.pending) == (2, 1, 1, 0)
    assert main(["--db", url, "status", str(second)]) == 0
    out = capsys.readouterr().out
    assert "7 runs: 6 ok, 1 failed" in out  # the experiment's summary: all its runs
    # board matrix ok failed interrupted pending cancelled running lost not started
    assert _table_row(out.split("its matrix per board")[1], "local") == [
        "local", "2", "1", "1", "0", "0", "0", "0", "0", "0"]
    assert main(["--db", url, "status", str(first)]) == 0
    assert _table_row(capsys.readouterr().out.split("its matrix per board")[1], "local") == [
        "local", "5", "5", "0", "0", "0", "0", "0", "0", "0"]


def test_cancelling_a_queued_job_announces_it(receiver: Receiver, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "queued.toml"
    spec.write_text('name = "queued"\n[[workload]]\nkind = "attn-bench"\nctx = 64\nheads = 2\n'
                    'kv_heads = 1\nhead_dim = 16\n')
    url = f"sqlite:///{tmp_path}/cancel.db"
    assert main(["--db", url, "submit", str(spec), "--notify", receiver.url]) == 0
    assert main(["--db", url, "cancel", "1"]) == 0
    assert flush(30)  # delivered (off the command's thread)
    [ended] = receiver.events
    assert (ended["event"], ended["job"], ended["state"]) == ("job-end", 1, "cancelled")
    assert ended["counts"]["ok"] == 0 and all(isinstance(n, int)
                                              for n in ended["counts"].values())
    assert ended["started_at"] is None
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00",
                        ended["finished_at"])
    with Store.open(url) as store:
        story = store.jobs.events(1)
    assert [e.event for e in story] == ["submitted", "cancelled"]
    assert story[1].cause.endswith("(it was queued)")
    assert "cancelled job 1" in capsys.readouterr().out


def test_jobs_stored_before_events_get_their_story(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/old.db"
    database = connect_database(url)
    migrate(database, "0010")
    moment = utcnow()
    with database.begin() as conn:
        conn.execute(insert(Job.__table__).values(
            experiment="old", spec_path="/s.toml", spec_text="", force=False, kind="queue",
            priority=2, owner="ann", state="done", holder="serve-9", submitted_at=moment,
            started_at=moment, finished_at=moment, message="job done: 4 ok"))
    database.dispose()
    with Store.open(url) as store:
        story = store.jobs.events(1)
    assert [(e.event, e.actor) for e in story] == [("submitted", "ann"),
                                                    ("claimed", "serve-9"), ("finished", None)]
    assert story[2].cause == "job done: 4 ok"


def test_serve_lines_start_with_the_utc_time() -> None:
    out = io.StringIO()
    stamped = Stamped(out, stamp=lambda: "T")
    stamped.write("one\ntw")
    stamped.write("o\n\nthree")
    stamped.flush()
    assert out.getvalue() == "T one\nT two\nT \nT three"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", utc_stamp())
    assert Stamped(sys.stdout).fileno() == sys.stdout.fileno()  # the stream's own
