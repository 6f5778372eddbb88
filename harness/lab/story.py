"""A job's story, as `benchfarm logs JOB` and the dashboard's job page tell it: its events
(submitted, claimed by which serve, waiting and why, drained, requeued, interrupted, taken
over, cancelled by whom, finished) and its runs' attempts (started, ended with their status),
in the order they happened, every time in UTC with its zone."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from db.job_events import JobAttempt
    from db.jobs import JobInfo
    from db.store import Store

ERROR_WIDTH = 70


@dataclass(frozen=True)
class StoryLine:
    at: datetime  # with its zone (UTC)
    what: str  # the event ("claimed"), or "run 12 started" / "run 12 ok"
    detail: str  # who and why, or the run's board and config

    @property
    def stamp(self) -> str:
        return self.at.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class JobStory:
    job: JobInfo
    lines: list[StoryLine]
    attempts: list[JobAttempt]

    def counts(self) -> dict[str, int]:
        """The job's attempts per status."""
        counts: dict[str, int] = {}
        for attempt in self.attempts:
            counts[attempt.status] = counts.get(attempt.status, 0) + 1
        return counts


def run_label(attempt: JobAttempt) -> str:
    config = " ".join(str(part) for part in (attempt.command, attempt.policy,
                                             None if attempt.k is None else f"k={attempt.k}")
                      if part)
    return f"{attempt.device}: {config} rep {attempt.repeat}"


def _error_line(error: str | None) -> str:
    lines = (error or "").strip().splitlines()
    return f": {lines[-1][:ERROR_WIDTH]}" if lines else ""


def job_story(store: Store, job_id: int) -> JobStory:
    """The job's events and its attempts' starts and ends, merged in time order (an event
    before a run line of the same moment: the claim before the runs it started)."""
    job = store.jobs.get(job_id)
    keyed: list[tuple[datetime, int, int, StoryLine]] = []
    for order, event in enumerate(store.jobs.events(job_id)):
        who = f"by {event.actor}" if event.actor else ""
        detail = "; ".join(part for part in (who, event.cause or "") if part)
        keyed.append((event.at, 0, order, StoryLine(event.at, event.event, detail)))
    attempts = store.jobs.attempts(job_id)
    for order, attempt in enumerate(attempts):
        name = f"run {attempt.run_id}" + (f" (attempt {attempt.attempt})"
                                          if attempt.attempt > 1 else "")
        if attempt.started_at is not None:
            keyed.append((attempt.started_at, 1, 2 * order, StoryLine(
                attempt.started_at, f"{name} started", run_label(attempt))))
        if attempt.finished_at is not None and attempt.status != "running":
            keyed.append((attempt.finished_at, 1, 2 * order + 1, StoryLine(
                attempt.finished_at, f"{name} {attempt.status}",
                run_label(attempt) + _error_line(attempt.error))))
    keyed.sort(key=lambda item: item[:3])
    return JobStory(job, [line for *_, line in keyed], attempts)
