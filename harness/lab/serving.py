"""One `benchfarm serve` service: which queued job it takes next, and running it to its end.

A queued job waits while none of the boards of one of its placements may take its owner's
work (a board not ``online``, or reserved for someone else: harness.execution.gate); the
job's message (and its ``waiting`` event) says why, for `benchfarm queue`, and the service
takes the next job. Which jobs wait and which one is taken is decided in the store's one
write transaction (``Jobs.claim_next``): a board freed by a release or an end of maintenance
goes to the best job that waited for it, whichever serve looks first. A job whose
boards stop taking work while it runs (maintenance: the run in flight finishes) goes back to
the queue with the reason, and resumes, skipping what is done, once they take work again.

A claimed job waits for a board another coordinator holds (db.leases). While it holds no board
at all, a queued job of higher priority that can start and wants one of its boards sends it
back to the queue (``Jobs.step_aside``, one transaction), and its serve takes the better job:
a board freed later goes to the highest-priority job, not to the one claimed first. A job
running on some of its boards keeps them; it gives a board up at its next run's turn, where a
higher-priority waiter goes first (db.leases).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray.exceptions import RaySystemError

from db.connection import DatabaseFailure
from db.errors import StoreError, StoreInputError
from db.jobs import JobInfo
from db.store import Store
from devices.inventory import Device, Inventory
from harness.errors import interrupts_held, printable, terminated
from harness.execution.coordinator import Coordinator, RunRequest, run_experiment
from harness.execution.gate import blocked_boards
from harness.execution.notify import Targets, announce_job, job_targets, targets_from
from harness.lab.health import HealthSchedule
from harness.plan.matrix import Placement, resolve_placements
from harness.spec import parse_spec


def job_placements(job: JobInfo, inventory: Inventory) -> list[Placement] | None:
    """The job's placements (None when its spec or devices no longer resolve: running it
    reports why)."""
    try:
        spec = parse_spec(job.spec_text, Path(job.spec_path))
        return resolve_placements(spec, list(inventory.devices.values()), job.devices)
    except Exception:  # noqa: BLE001 - whatever the job holds, its run reports it
        return None


MAX_REASON_CHARS = 2000  # of a failed job's message


def not_the_jobs(exc: Exception) -> bool:
    """Whether a job's run failed for this serve's own means, not the job: the store or the
    Ray cluster (the serve stops and the job goes back to the queue, as when it is killed)."""
    if isinstance(exc, StoreInputError):
        return False  # what the job asked of the store is wrong: the job's
    return isinstance(exc, StoreError | DatabaseFailure | RaySystemError | ConnectionError)


def job_boards(job: JobInfo, inventory: Inventory) -> set[str] | None:
    """The boards the job may run on (None: unknown, see job_placements)."""
    placements = job_placements(job, inventory)
    return None if placements is None else {n for p in placements for n in p.devices}


@dataclass
class Service:
    store: Store
    inventory: Inventory
    who: Coordinator
    targets: Targets  # `serve --notify`, besides each job's own
    health: HealthSchedule | None  # None: no scheduled health checks
    bad_after: int | None = None
    _placements: dict[int, list[Placement] | None] = field(default_factory=dict)

    def placements(self, job: JobInfo) -> list[Placement] | None:
        if job.id not in self._placements:
            self._placements[job.id] = job_placements(job, self.inventory)
        return self._placements[job.id]

    def why_waiting(self, conn: Any, job: JobInfo) -> str | None:
        """Why the job cannot start now: a placement none of whose boards takes its work
        (read on ``conn``, the claim's transaction)."""
        for placement in self.placements(job) or []:
            blocked = blocked_boards(self.store, placement.devices, job.owner, conn)
            if len(blocked) == len(placement.devices):
                return "; ".join(blocked.values())
        return None

    def boards_named(self, job: JobInfo) -> set[str]:
        return {n for p in self.placements(job) or [] for n in p.devices}

    def step_aside(self, job: JobInfo) -> Callable[[], str | None]:
        """For the job's coordinator while it holds no board: back to the queue when a better
        queued job can start and wants a board of this job's (the reason; None: it goes on)."""
        mine = self.boards_named(job)

        def wanting(other: JobInfo) -> str | None:
            return min(mine & self.boards_named(other), default=None)

        return lambda: self.store.jobs.step_aside(job.id, self.who.holder, self.why_waiting,
                                                  wanting)

    def claim(self) -> JobInfo | None:
        """The best queued job that can start now, claimed for this serve (None: none can;
        the waiting ones say why)."""
        return self.store.jobs.claim_next(self.who.holder, self.who.ttl_s, self.why_waiting)

    def boards_of(self, job: JobInfo) -> list[Device]:
        return [self.inventory.devices[name] for name in sorted(self.boards_named(job))]

    def serve(self, job: JobInfo) -> str:
        """Run one claimed job to its end; returns the line to print. Interrupts requeue it."""
        store = self.store
        if self.health is not None:
            for report in self.health.before_job(self.boards_of(job)):
                if not report.ok:
                    bad = "; ".join(f"{i.name}: {i.detail}" for i in report.items if not i.ok)
                    print(f"health check of {report.device} failed: {bad}", flush=True)
        # the job row's http(s) URLs only: a command in a shared store's row never runs here
        targets = job_targets(job.notify) + self.targets
        spec_targets = Targets()  # the spec's [notify], once it parses
        try:
            spec = parse_spec(job.spec_text, Path(job.spec_path))
            spec_targets = targets_from(section=spec.notify)
            summary = run_experiment(RunRequest(spec, self.inventory, job.devices, job.force,
                                                coordinator=self.who, job_id=job.id,
                                                notify=targets, bad_after=self.bad_after,
                                                step_aside=self.step_aside(job)),
                                     store)
        except KeyboardInterrupt:
            signal = "SIGTERM" if terminated() else "SIGINT (Ctrl-C)"
            store.jobs.requeue(job.id, f"requeued: its coordinator was stopped by {signal}",
                               "interrupted")
            raise
        except Exception as exc:  # noqa: BLE001 - a job's error ends the job, not the service
            if not_the_jobs(exc):
                raise  # the store or the cluster failed: this serve stops, the job is requeued
            reason = str(exc) if getattr(type(exc), "exit_code", None) is not None else \
                f"its input broke its run ({type(exc).__name__}: {exc})"
            reason = printable(" ".join(reason.split()))[:MAX_REASON_CHARS]
            # failed once, with its reason, never retried: the next job is served
            with interrupts_held():  # a serve stopped now still announces the end it stored
                store.jobs.finish(job.id, "failed", reason)
                announce_job(store, job.id, targets + spec_targets)
            return f"job {job.id} ({job.experiment}) failed: {reason}"
        if summary.stepped_aside:  # back in the queue already, in the decision's transaction
            return f"job {job.id} ({job.experiment}) back in the queue: {summary.stepped_aside}"
        why = None if summary.complete or summary.cancelled else self._blocked_now(job)
        if why:
            store.jobs.requeue(job.id, f"waiting: {why} ({summary.line()})", "drained")
            return f"job {job.id} waits for its boards: {why}"
        state = "cancelled" if summary.cancelled else "done" if summary.succeeded else "failed"
        with interrupts_held():  # a serve stopped now still announces the end it stored
            store.jobs.finish(job.id, state, summary.line())
            announce_job(store, job.id, targets + spec_targets)
        return f"job {job.id} {state}: {summary.line()}"

    def _blocked_now(self, job: JobInfo) -> str | None:
        blocked = blocked_boards(self.store, [d.name for d in self.boards_of(job)], job.owner)
        return "; ".join(blocked.values()) or None

