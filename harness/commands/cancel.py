"""`benchfarm cancel JOB|EXPERIMENT [--force]`: drop a queued job or stop a running one.

An experiment name stands for its one queued or running job; when it has several, they are
listed and nothing is cancelled (exit 2). A job is cancelled by its owner; someone else's
needs an admin and ``--force``, and is recorded as done by the admin for the owner (the job's
``cancelled_by`` and the audit trail, `benchfarm users log`). A queued job's end is announced
here (its URLs and its spec's [notify]); a running one's by its coordinator as it stops.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from harness.commands.arguments import job_ref
from harness.commands.context import caller_of, store_of

if TYPE_CHECKING:
    from db.jobs import JobInfo
    from harness.execution.notify import Targets


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "cancel", help="cancel a queued or running job (its in-flight runs are stored as "
                       "cancelled)")
    parser.add_argument("job", metavar="JOB|EXPERIMENT", type=job_ref,
                        help="job id, or an experiment with exactly one active job "
                             "(see `benchfarm queue`)")
    parser.add_argument("--force", action="store_true",
                        help="cancel another owner's job (admins only; recorded)")
    parser.set_defaults(func=run)


def queued_targets(job: JobInfo) -> Targets:
    """Where a queued job's end is announced: its http(s) URLs and its spec's [notify] (a
    spec that no longer parses has none: its URLs are still told)."""
    from pathlib import Path

    from harness.execution.notify import job_targets, targets_from
    from harness.spec import parse_spec

    try:
        spec_notify = parse_spec(job.spec_text, Path(job.spec_path)).notify
    except Exception:  # noqa: BLE001 - whatever the stored spec holds, the URLs are told
        spec_notify = {}
    return job_targets(job.notify) + targets_from(section=spec_notify)


def run(args: argparse.Namespace) -> int:
    from db.jobs import ACTIVE
    from harness.errors import InputError
    from harness.execution.notify import announce_job

    with store_of(args, create=False) as store:
        caller = caller_of(store)
        if args.job.isdigit():
            job = store.jobs.get(int(args.job))
        else:
            jobs = store.jobs.active(args.job)
            if not jobs:
                raise InputError(f"experiment {args.job!r} has no queued or running job; "
                                 "`benchfarm queue` lists them")
            if len(jobs) > 1:
                listed = ", ".join(f"job {j.id} ({j.state}, owner {j.owner})" for j in jobs)
                raise InputError(f"experiment {args.job!r} has {len(jobs)} active jobs: "
                                 f"{listed}; name one: `benchfarm cancel JOB`")
            job = jobs[0]
        if job.state not in ACTIVE:
            raise InputError(f"job {job.id} has already ended ({job.state})")
        acting_for = caller.acting_for(job.owner, f"job {job.id}", "cancel", forced=args.force)
        forced = f" (--force; the owner is {job.owner})" if acting_for else ""
        cancelled = store.jobs.cancel(job.id, caller.name, f"cancelled by {caller.name}{forced}",
                                      caller.event("cancel", f"job {job.id}", acting_for,
                                                   f"experiment {job.experiment}"))
        if not cancelled:
            raise InputError(f"job {job.id} ended meanwhile")
        if job.state == "queued":  # no coordinator holds it to announce its end: this does
            announce_job(store, job.id, queued_targets(job))
    print(f"cancelled job {job.id} ({job.experiment}, owner {job.owner}); a running "
          "coordinator stops it within a second or two")
    return 0
