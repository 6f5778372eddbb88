"""`benchfarm logs JOB`: what the store knows of a job: its life and the runs it stored."""

from __future__ import annotations

import argparse

from harness.commands.arguments import job_id
from harness.commands.context import store_of
from harness.commands.table import format_table, shown

ERROR_WIDTH = 70


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("logs", help="a job's history and the runs it stored")
    parser.add_argument("job", type=job_id, help="job id (`submit` and `run` print it)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from db.leases import utcnow

    with store_of(args, create=False) as store:
        job = store.jobs.get(args.job)
        stored = job.experiment in store.list_experiments()
        runs = store.list_runs(job.experiment) if stored else []
    print(f"job {job.id}: experiment {job.experiment}, owner {shown(job.owner)}, priority "
          f"{job.priority}, {job.kind}, now {job.state}")
    events = [(job.submitted_at, "submitted"),
              (job.started_at, f"started by {shown(job.holder)}"),
              (job.finished_at, job.state + (f" by {shown(job.cancelled_by)}"
                                             if job.cancelled_by else ""))]
    for moment, what in events:
        if moment is not None:
            print(f"  {moment:%Y-%m-%d %H:%M:%S} UTC  {what}")
    if job.message:
        print(f"  message: {shown(job.message)}")
    start, end = job.started_at, job.finished_at or utcnow()
    mine = [r for r in runs if start and r.finished_at and start <= r.finished_at <= end]
    if mine:
        print(f"\nruns stored while it ran ({len(mine)}):")
        print(format_table(
            ["finished (UTC)", "run", "device", "command", "policy", "k", "rep", "status",
             "error"],
            [[f"{r.finished_at:%H:%M:%S}", r.id, r.device, r.command, r.policy, r.k, r.repeat,
              r.status, (r.error or "").strip().splitlines()[-1][:ERROR_WIDTH] if r.error
              else None] for r in sorted(mine, key=lambda r: r.finished_at)]))
    return 0
