"""The dashboard's job page tells the job's story: its events and its runs' attempts in order,
the same lines as `benchfarm logs JOB` (harness.lab.story)."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

from fixtures_db import add_refs, sample_result
from fixtures_web import serving
from test_web import get, get_json  # the dashboard tests' GETs

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


def test_each_job_of_one_experiment_counts_its_own_runs(tmp_path: Path) -> None:
    """A rerun of an experiment is not credited with the earlier job's runs: the dashboard's
    queue and each job's page show done + failed within the job's own total."""
    url = f"sqlite:///{tmp_path}/two.db"
    with Store.open(url) as store:
        refs = add_refs(store, experiment="exp")
        jobs = []
        for given, statuses in ((3, ("ok", "ok", "ok")), (2, ("ok",))):
            job = store.jobs.add("exp", "/exp.toml", "name = 'exp'\n", owner="ana")
            store.jobs.claim_next("serve-a", stale_after_s=60)
            store.jobs.set_totals(job, {"local": given})
            for n, status in enumerate(statuses):
                result = sample_result(refs, f"job-{job}-run-{n}", status=status)
                result.job_id = job
                store.save_run(result)
            jobs.append(job)
        store.jobs.finish(jobs[0], "done", "3 ok")
    with serving(url) as base:
        first, second = (get_json(f"{base}/api/jobs/{job}") for job in jobs)
        listed = {j["id"]: j for j in get_json(f"{base}/api/jobs")}
    assert (first["total"], first["done"], first["pending"]) == (3, 3, 0)
    assert (second["total"], second["done"], second["pending"]) == (2, 1, 1)
    assert (listed[jobs[1]]["total"], listed[jobs[1]]["done"]) == (2, 1)
