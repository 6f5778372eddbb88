"""What the dashboard shows, read from the store: one place for the HTML pages and the JSON API.

``FarmData`` reads each view (harness.web.views: dataclasses of plain values) through db's
named reads. The store is only read: it is opened without migrating (a dashboard never changes
a team's schema), and a store that cannot be read raises ``db.StoreError``, which the app turns
into a page.

A board shows two things apart: its stored state (``db.boards``: online, maintenance, retired or
bad, with who set it, when and why; online when never set) and its activity, derived from its
lease (running, warm-up or idle). An experiment with runs of more than one engine revision
carries its history: the revisions in commit order and the steps found in each metric, the same
as the report's history section (``reports.history``).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from db.board_days import board_days
from db.connection import connect_database, shown_url
from db.errors import StoreInputError
from db.jobs import ACTIVE, FINISHED_STATES, JobInfo
from db.leases import LeaseInfo, utcnow
from db.store import Store
from devices.inventory import load_inventory
from harness.access.caller import user_of_token
from harness.identity import commit_order, revision_labels
from harness.lab.story import JobStory, job_story
from harness.verify.claims import audit_claims
from harness.web.timeline import WINDOW, BoardTimeline, timelines
from harness.web.views import (
    PAGE,
    Board,
    BoardEvent,
    ExperimentHistory,
    ExperimentRow,
    ExperimentView,
    Failure,
    Health,
    JobView,
    Page,
    Placement,
)
from reports.audit import Verdict
from reports.history import first_run_order, history, revision_runs
from reports.metrics import METRICS
from reports.render import build_sections, sections_html
from reports.runs import load_experiment

RECENT_FAILURES = 3  # failed runs shown per board
FINISHED_JOBS = 20  # finished jobs listed under the queue
ACTIVE_JOBS = 100  # running and queued jobs listed (the queue's head; the rest are counted)
CACHED_EXPERIMENTS = 16  # experiments whose views are kept (read again when their runs change)
# experiments whose newest job's progress is kept: as many as the queue lists
CACHED_PROGRESS = ACTIVE_JOBS + FINISHED_JOBS
FAILURE_SCAN = 500  # newest failed runs read to find each board's recent ones
HEALTH_SHOWN = 5  # health checks shown per board, newest first
EVENTS_SHOWN = 5  # board events shown per board, newest first
HISTORY_SECTION = "history"  # the report's section the experiment page shows first


def _activity(lease: LeaseInfo | None) -> str:
    if lease is None:
        return "idle"
    return "warm-up" if lease.run_key is None else "running"


@dataclass(frozen=True)
class ReadOnlySteps:
    """A store's kept steps (reports.history.StepCache), read only: what the dashboard finds
    there it shows; what it must fit itself it keeps in its own page cache, not the store."""

    store: Store

    def known_steps(self, keys: Any) -> dict[str, list[Any]]:
        return self.store.known_steps(keys)

    def keep_steps(self, found: dict[str, list[Any]]) -> None:
        pass


class FarmData:
    """The dashboard's reads of one store (any SQLAlchemy URL), opened at the first read."""

    def __init__(self, url: str, claims_dir: Path) -> None:
        self.url = url
        self.claims_dir = claims_dir
        self._store: Store | None = None
        self._lock = threading.Lock()
        # experiment -> (its mark when read, what was read): the experiment page's parts, read
        # again once the experiment has a new attempt or run (the live page asks every few
        # seconds; a nightly's report takes seconds to make)
        self._kept: dict[tuple[str, str], tuple[tuple[Any, ...], Any]] = {}

    @property
    def shown_url(self) -> str:
        """The store's URL without its password."""
        return shown_url(self.url) or "(not a SQLAlchemy URL)"

    @property
    def store(self) -> Store:
        with self._lock:
            if self._store is None:
                self._store = Store(connect_database(self.url, create=False), read_only=True)
            return self._store

    @property
    def steps(self) -> ReadOnlySteps:
        """The steps the store keeps, read and never written (the dashboard writes nothing)."""
        return ReadOnlySteps(self.store)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()

    # -- logins --------------------------------------------------------------------------------

    def users_exist(self) -> bool:
        """Whether the store has users (then each request needs one's token)."""
        return self.store.users.exist()

    def user_of(self, token: str) -> str | None:
        """The name of the active user whose token this is, or None."""
        user = user_of_token(self.store, token)
        return None if user is None else user.name

    # -- boards --------------------------------------------------------------------------------

    def boards(self) -> list[Board]:
        store = self.store
        leases = {lease.board: lease for lease in store.leases.active()}
        # each board's latest attempt, and its latest failed ones (measurements: attempts)
        activity = store.boards.activity(FAILURE_SCAN)
        failures: dict[int, list[Failure]] = defaultdict(list)
        for failed in activity.failed:
            if len(failures[failed.device_id]) < RECENT_FAILURES:
                failures[failed.device_id].append(Failure(failed.run_id, failed.experiment,
                                                          failed.finished_at, failed.error))
        known = {b.name: (b.id, b.cls, b.arch, bool(b.emulated)) for b in activity.boards}
        reservations = store.boards.reservations()
        names = sorted({*known, *store.boards.states(), *reservations})
        states = store.boards.states(names)  # online for a board whose state was never set
        boards = []
        for name in names:
            device_id, cls, arch, emulated = known.get(name, (None, None, None, None))
            lease, stored = leases.get(name), states[name]
            last = activity.last.get(device_id)
            status, at = (last.status, last.finished_at) if last else (None, None)
            boards.append(Board(
                name=name, cls=cls, arch=arch, emulated=emulated, state=stored.state,
                reason=stored.reason, since=stored.since, changed_by=stored.changed_by,
                lost_in_a_row=stored.failures, activity=_activity(lease),
                reservation=reservations.get(name),
                health=[Health.of(h) for h in store.boards.health(name, HEALTH_SHOWN)],
                holder=lease.holder if lease else None,
                experiment=lease.experiment if lease else None,
                run_key=lease.run_key if lease else None,
                lease_expires=lease.expires if lease else None, last_run_at=at,
                last_status=status, failures=failures.get(device_id, []),
                events=[BoardEvent.of(c) for c in reversed(store.boards.history(
                    name, EVENTS_SHOWN))]))
        return boards

    def timelines(self, boards: list[str]) -> list[BoardTimeline]:
        """What each of ``boards`` did over the last 24 hours (``harness.web.timeline``)."""
        now = utcnow()
        return timelines(board_days(self.store.database, now - WINDOW), boards, now)

    # -- jobs ----------------------------------------------------------------------------------

    def jobs(self) -> list[JobView]:
        """The running and queued jobs at the head of the queue (ACTIVE_JOBS of them), then
        the newest finished ones."""
        jobs = self.store.jobs
        active = jobs.list(ACTIVE, ACTIVE_JOBS)
        finished = jobs.list(FINISHED_STATES, FINISHED_JOBS)
        return [self._job_view(job, self._newest(job)) for job in active + finished]

    def queue_total(self) -> int:
        """How many jobs are running or queued (the page lists ACTIVE_JOBS of them)."""
        return self.store.jobs.count(ACTIVE)

    def _newest(self, job: JobInfo) -> bool:
        latest = self.store.jobs.latest(job.experiment)
        return latest is not None and latest.id == job.id

    def job(self, job_id: int) -> JobView | None:
        store = self.store
        try:
            info = store.jobs.get(job_id)
        except StoreInputError:  # no job with this id
            return None
        return self._job_view(info, True)

    def story(self, job_id: int) -> JobStory | None:
        """The job's events and its attempts, in order (None: no such job)."""
        try:
            return job_story(self.store, job_id)
        except StoreInputError:  # no job with this id
            return None

    def _job_view(self, job: JobInfo, counted: bool) -> JobView:
        """A job with its progress per placement, its own runs counted (db.jobs.progress)
        when ``counted``: the job's own page, and in the lists the newest job of each
        experiment only (a query per job)."""
        placements = self._kept_for(job.experiment, f"progress {job.id}", lambda: [
            Placement.of(p) for p in self.store.jobs.progress(job.experiment, job)],
            CACHED_PROGRESS) if counted else []
        end = job.finished_at or utcnow()
        elapsed = (end - job.started_at).total_seconds() if job.started_at else None
        sums = {name: sum(getattr(p, name) for p in placements)
                for name in ("total", "done", "failed", "running", "pending")}
        remaining = None
        if job.state == "running" and job.started_at is not None and elapsed:
            finished_here = self.store.jobs.finished_since(job.id, job.started_at)
            if finished_here:
                remaining = elapsed / finished_here * (sums["pending"] + sums["running"])
        return JobView(
            id=job.id, experiment=job.experiment, owner=job.owner, priority=job.priority,
            state=job.state, kind=job.kind, holder=job.holder, message=job.message,
            submitted_at=job.submitted_at, started_at=job.started_at,
            finished_at=job.finished_at, elapsed_s=elapsed, remaining_s=remaining,
            placements=placements, **sums)

    # -- experiments ---------------------------------------------------------------------------

    def experiments(self, limit: int = PAGE, offset: int = 0) -> Page:
        """A page of the experiments, the most recently run first, with their runs per status
        (kept by the store as runs land: a few rows each, however many runs they have)."""
        store = self.store
        lines = store.experiment_lines(limit, offset, newest_first=True)
        return Page([ExperimentRow(line.name, line.updated_at, line.counts, line.total)
                     for line in lines], offset, store.count_experiments())

    def experiment(self, name: str) -> ExperimentView:
        """One experiment; an unknown name raises ``db.StoreInputError``."""
        store = self.store
        summary = self._kept_for(name, "summary", lambda: store.experiment_summary(name))
        latest = store.jobs.latest(name)
        found = self.history(name)
        return ExperimentView(
            name=summary.name, spec_hash=summary.spec_hash, updated_at=summary.updated_at,
            counts=summary.counts, devices=summary.devices, groups=summary.groups,
            job=None if latest is None else self._job_view(latest, True),
            revisions=found.revisions, steps=found.steps,
            revision_labels=revision_labels(
                [*(g.revision for g in summary.groups if g.revision), *found.revisions]))

    def history(self, name: str) -> ExperimentHistory:
        """The experiment's revisions and steps (every metric's), from what a history reads."""
        def read() -> ExperimentHistory:
            runs = revision_runs(self.store, name)
            revisions = first_run_order(runs)
            order = commit_order(revisions) if len(revisions) > 1 else []
            histories = [hist for metric in METRICS
                         if (hist := history(runs, order, metric, cache=self.steps)).series] \
                if order else []
            return ExperimentHistory(
                revisions=list(dict.fromkeys(r for hist in histories for r in hist.revisions)),
                steps=[step for hist in histories for step in hist.steps], histories=histories)
        return self._kept_for(name, "history", read)

    def report_html(self, name: str) -> tuple[str, str]:
        """The experiment's history across revisions (timelines with their steps; empty with
        one revision) and the rest of its report's sections, rendered by the report's own
        code (revisions in git's commit order); every value from the store is escaped there.
        The timelines are those of the page's own history (``history``: made once, and the
        figures beyond a board's roofline left out, as `benchfarm history` leaves them)."""
        def render() -> tuple[str, str]:
            sections = [s for s in build_sections(load_experiment(self.store, name),
                                                  commit_order, self.steps,
                                                  histories=self.history(name).histories)
                        if s.has_content()]
            return (sections_html([s for s in sections if s.anchor == HISTORY_SECTION]),
                    sections_html([s for s in sections if s.anchor != HISTORY_SECTION]))
        return self._kept_for(name, "report", render)

    def _kept_for(self, name: str, part: str, read: Any, keep: int = CACHED_EXPERIMENTS) -> Any:
        """``read()`` of the experiment's ``part``, kept until the experiment has a new attempt
        or run; of each kind of part (its first word: report, history, progress) those of the
        ``keep`` experiments read most recently are kept."""
        mark = self.store.experiment_mark(name)
        with self._lock:
            kept = self._kept.get((name, part))
        if kept is not None and kept[0] == mark:
            return kept[1]
        value = read()
        kind = part.split()[0]
        with self._lock:
            self._kept.pop((name, part), None)
            self._kept[(name, part)] = (mark, value)
            names = list(dict.fromkeys(n for n, p in reversed(self._kept)
                                       if p.split()[0] == kind))
            for old_name, old_part in list(self._kept):
                if old_part.split()[0] == kind and old_name not in names[:keep]:
                    del self._kept[(old_name, old_part)]
        return value

    # -- audits --------------------------------------------------------------------------------

    def claims_files(self) -> list[str]:
        """The claims files the audit page offers (names in the claims folder)."""
        return sorted(path.name for path in self.claims_dir.glob("*.toml"))

    def audit(self, claims_file: str) -> list[Verdict] | None:
        """The claims file's verdicts, judged now on the runs already stored (nothing is run,
        built or written: `benchfarm audit --stored-only`); None for a name not offered."""
        if claims_file not in self.claims_files():
            return None
        return audit_claims(self.claims_dir / claims_file, self.store, load_inventory(None),
                            None, ["local"], run_missing=False)
