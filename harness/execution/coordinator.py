"""`benchfarm run` (and each job of `benchfarm serve`) end to end: plan a spec on Ray, run what
is missing, report the counts.

Every coordination is a job in the store (db.jobs): `run` adds one that it runs at once,
`serve` claims a queued one. The job carries the matrix's totals per placement (for `status`)
and its heartbeat; board leases make coordinators sharing a store take turns on each board.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from db.errors import StoreError
from db.store import Store
from devices.inventory import Inventory
from harness.access.caller import Caller, resolve_caller
from harness.errors import InputError, terminated
from harness.execution.cluster import build_on_ray, check_resources, ray_session
from harness.execution.credentials import Credentials
from harness.execution.facts import board_facts
from harness.execution.gate import BoardGate, blocked_boards
from harness.execution.leases import (
    JOB_HEARTBEAT_MAX_S,
    Cancelled,
    Sharing,
    SteppedAside,
    job_heartbeat,
    lease_ttl,
    new_holder,
)
from harness.execution.notify import Targets, announce_job, flush, targets_from
from harness.execution.progress import Progress
from harness.execution.scheduler import Scheduler
from harness.identity import commit_order
from harness.plan import MAX_RUNS
from harness.plan.fit import check_fit
from harness.plan.inputs import check_inputs
from harness.plan.matrix import Placement, check_size, resolve_placements
from harness.plan.planner import make_plan, prepare, register_plan
from harness.spec import Spec
from reports.baseline import keep_baseline_of
from reports.history import keep_steps_of


@dataclass
class RunSummary:
    experiment: str
    total: int  # runs in the matrix
    skipped: int  # already stored as ok
    counts: Counter[str] = field(default_factory=Counter)  # this session: ok/failed/pending...
    cancelled: bool = False  # stopped by `benchfarm cancel`
    job_id: int | None = None
    # why its job went back to the queue for a better one (Sharing.step_aside); None: it did not
    stepped_aside: str | None = None

    @property
    def complete(self) -> bool:
        return not (self.counts["pending"] or self.counts["interrupted"] or self.counts["lost"]
                    or self.cancelled or self.stepped_aside)

    @property
    def all_failed(self) -> bool:
        """Every run of the matrix failed: none ok, now, before or by another coordinator (a
        value the engine refuses fails them all; that is no success)."""
        c = self.counts
        return bool(c["failed"]) and not (c["ok"] or c["elsewhere"] or self.skipped)

    @property
    def succeeded(self) -> bool:
        return self.complete and not self.all_failed

    def line(self) -> str:
        c = self.counts
        line = (f"experiment {self.experiment}: {self.total} runs in the matrix, "
                f"{self.skipped} already done, {c['ok']} ok, {c['failed']} failed, "
                f"{c['pending']} pending now")
        if c["lost"]:
            line += f", {c['lost']} lost with their board's runner (rerun once it is back)"
        if c["elsewhere"]:
            line += f", {c['elsewhere']} done meanwhile by another coordinator"
        if c["expired"]:
            line += (f", {c['expired']} finished after their lease expired (kept as attempts, "
                     "not counted)")
        if self.all_failed:
            line += "; every run failed"
        if self.stepped_aside:
            line += f"; back in the queue ({self.stepped_aside})"
        return line + (f"; cancelled ({c['cancelled']} in flight)" if self.cancelled else "")


@dataclass
class Coordinator:
    """Who is coordinating: the holder id for leases and jobs, and the lease time."""

    holder: str = field(default_factory=new_holder)
    ttl_s: float = field(default_factory=lease_ttl)


@dataclass
class RunRequest:
    """What `benchfarm run` (or one job of `benchfarm serve`) asks for."""

    spec: Spec
    inventory: Inventory
    selectors: Sequence[str] | None = None  # --devices (None: the spec's own)
    force: bool = False  # redo runs stored as ok
    ray_address: str | None = None  # join this cluster (None: a local Ray instance)
    stream: TextIO | None = None  # progress lines (None: stderr)
    max_runs: int = MAX_RUNS  # refuse a larger matrix
    coordinator: Coordinator = field(default_factory=Coordinator)
    job_id: int | None = None  # the queued job being served (None: a one-shot job is recorded)
    # `serve`'s: the job goes back to the queue for a better one (Sharing.step_aside)
    step_aside: Callable[[], str | None] | None = None
    # the operator's --notify (the spec's [notify] URLs are added); a served job's stored URLs
    notify: Targets = field(default_factory=Targets)
    bad_after: int | None = None  # runs lost in a row that make a board bad (None: default)
    caller: Caller | None = None  # who runs it, the one-shot job's owner (None: resolved from
    # the store and the token file, as a command does)


def run_experiment(request: RunRequest, store: Store) -> RunSummary:
    """Run the spec's missing runs; a one-shot request records a job of its own, finished when
    this returns."""
    spec, who = request.spec, request.coordinator
    recorded = board_facts(store, spec, request.inventory, request.selectors)
    placements = resolve_placements(spec, list(request.inventory.devices.values()),
                                    request.selectors, recorded)
    check_size(spec, placements, request.max_runs)  # before Ray starts and anything is stored
    check_inputs(spec)  # the model, tokenizer and template read now: an unreadable one is exit 2
    check_fit(spec, placements, request.inventory.devices, recorded)  # weights beyond memory
    for name in sorted({name for p in placements for name in p.devices}):
        Credentials.of(request.inventory.devices[name])  # an unreadable key: one line, now
    job_id, one_shot = request.job_id, request.job_id is None
    targets = targets_from(section=spec.notify) + request.notify
    if job_id is None:
        caller = request.caller or resolve_caller(store)
        refuse_blocked(store, placements, caller.name)
        job_id = store.jobs.add(spec.name, str(spec.path), spec.text, owner=caller.name,
                                devices=list(request.selectors) if request.selectors else None,
                                force=request.force, holder=who.holder,
                                notify=targets.as_dict(),
                                event=caller.event("run", detail=f"experiment {spec.name}"))
        print(f"job {job_id}: experiment {spec.name} (`benchfarm cancel {job_id}` stops it)",
              file=request.stream or sys.stderr, flush=True)
    job = store.jobs.get(job_id)  # its owner and priority (a served job has its own)
    gate = BoardGate(store, [n for p in placements for n in p.devices],
                     job.owner, who.holder, targets, request.bad_after)
    try:
        with job_heartbeat(store, job_id, min(who.ttl_s / 3, JOB_HEARTBEAT_MAX_S)):
            sharing = Sharing(store, who.holder, who.ttl_s, spec.name, job_id, job.priority,
                              request.step_aside)
            summary = _run(request, store, placements, sharing, gate)
    except BaseException as exc:
        if one_shot:
            try:
                interrupted = isinstance(exc, KeyboardInterrupt)
                why = ("SIGTERM" if terminated() else "SIGINT (Ctrl-C)") if interrupted \
                    else f"{type(exc).__name__}: {exc}"
                store.jobs.finish(job_id, "failed", f"stopped: {why}",
                                  "interrupted" if interrupted else "finished")
            except StoreError:
                pass  # the store itself failed: its heartbeat stopped, the next claim ends it
            else:
                announce_job(store, job_id, targets)
                flush()  # a one-shot run ends here: its job's end is delivered first
        raise
    summary.job_id = job_id
    if summary.counts["ok"]:
        keep_history(store, spec.name, request.stream)
    if one_shot:
        store.jobs.finish(job_id, "done" if summary.succeeded else "failed", summary.line())
        announce_job(store, job_id, targets)
        flush()  # a one-shot run ends here: its job's end is delivered first
    return summary


def keep_history(store: Store, experiment: str, stream: TextIO | None) -> None:
    """Once runs landed: find and keep whether the experiment's exact-attention baseline
    fails (for `status`'s list), and the steps of its history that the store does not keep
    yet (only the series that gained points are fitted), so that reports and the dashboard
    read them. The job's results are stored already: a failure here is said, and left to the
    next `status` or report to try again."""
    try:
        keep_baseline_of(store, experiment)
        keep_steps_of(store, experiment, commit_order)
    except (StoreError, ValueError) as exc:
        print(f"experiment {experiment}: what its runs show (its baseline, its history's "
              f"steps) was not kept ({exc}); `status` and a report find it",
              file=stream or sys.stderr, flush=True)


def refuse_blocked(store: Store, placements: list[Placement], owner: str) -> None:
    """A placement none of whose boards may take ``owner``'s work now is bad input (exit 2)."""
    for placement in placements:
        blocked = blocked_boards(store, placement.devices, owner)
        if len(blocked) == len(placement.devices):
            raise InputError("; ".join(blocked.values()) + ": no run can start there "
                             "(`benchfarm devices list` shows the boards)")


def inventory_resources(inventory: Inventory) -> dict[str, float]:
    """The Ray custom resources a local Ray instance declares for the inventory's boards: a
    runner holds its board's resources while it lives, so a local instance, where every board
    runs, declares enough for all of them at once."""
    resources: dict[str, float] = {}
    for device in inventory.devices.values():
        for name, amount in device.resources.items():
            resources[name] = resources.get(name, 0.0) + amount
    return resources


def _run(request: RunRequest, store: Store, placements: list[Placement],
         sharing: Sharing, gate: BoardGate) -> RunSummary:
    spec, inventory = request.spec, request.inventory
    with ray_session(request.ray_address, inventory_resources(inventory)):
        check_resources([inventory.devices[name] for p in placements for name in p.devices])
        prepared = prepare(spec, placements, build_on_ray)
        plan = register_plan(make_plan(spec, placements, inventory.devices, prepared), store,
                             request.force)
        if sharing.job_id is not None:
            # the job's own runs: those of its matrix not stored as ok by an earlier job
            store.jobs.set_totals(sharing.job_id,
                                  dict(Counter(r.placement.key for r in plan.todo)))
        summary = RunSummary(spec.name, len(plan.runs), plan.skipped)
        progress = Progress(len(plan.todo), list(plan.boards), plan.skipped, request.stream)
        progress.show()
        scheduler = Scheduler(plan, store, progress, sharing, gate)
        try:
            if plan.todo:
                summary.counts = scheduler.run()
        except Cancelled:
            summary.counts, summary.cancelled = scheduler.counts, True
        except SteppedAside as exc:
            summary.counts, summary.stepped_aside = scheduler.counts, str(exc)
        finally:
            progress.close()
    return summary
