"""The dashboard's job page tells the job's story: its events and its runs' attempts in order,
the same lines as `benchfarm logs JOB` (harness.lab.story)."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

from fixtures_db import add_refs, sample_result
from fixtures_web import serving
from test_web import get  # the dashboard tests' GET

from db.store import Store


def test_the_job_page_shows_its_events_and_runs_in_order(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/story.db"
    with Store.open(url) as store:
        refs = add_refs(store, experiment="exp")
        job = store.jobs.add("exp", "/exp.toml", "name = 'exp'\n", owner="ana", priority=4)
        store.jobs.claim_next("serve-a", stale_after_s=60)
        # two attempts between its claim and its end (stored in well under a millisecond
        # apart would not be: each store write takes longer)
        start = store.jobs.events(job)[-1].at
        for n, status in enumerate(("ok", "failed")):
            result = sample_result(refs, f"key-{n}", status=status,
                                   started_at=start + timedelta(microseconds=200 * n + 100),
                                   finished_at=start + timedelta(microseconds=200 * n + 200))
            result.job_id = job
            store.save_run(result)
        store.jobs.finish(job, "failed", "1 ok, 1 failed")
    with serving(url) as base:
        code, page = get(f"{base}/jobs/{job}")
        missing, _ = get(f"{base}/jobs/999")
        _, index = get(f"{base}/")
    assert code == 200 and missing == 404
    story = page[page.index('<table id="story">'):].split("</table>")[0]
    whats = re.findall(r"<tr class=\"(?:run|event)\"><td class=\"text\">[^<]+</td>\s*"
                       r"<td class=\"text\">([^<]+)</td>", story)
    assert whats == ["submitted", "claimed", "run 1 started", "run 1 ok", "run 2 started",
                     "run 2 failed", "finished"]
    assert "by serve-a" in story and "1 ok, 1 failed" in story
    assert "2 attempts · 1 failed · 1 ok" in page
    assert f'<a href="/jobs/{job}">{job}</a>' in index  # the queue links to the job's page
