"""`benchfarm wait JOB`: block until the job ends; exit 0 done, 1 failed, 3 cancelled.

A one-shot `benchfarm run` whose coordinator died (SIGKILL, a lost machine) never ends its job
itself: once the job's heartbeat is older than the lease time (``--lease-ttl``, at least three
missed beats) `wait` marks it failed as lost and ends (a queued job of a dead `serve` goes back
to the queue for the next one, as `serve` itself would do).
"""

from __future__ import annotations

import argparse

from harness.commands.arguments import add_lease_ttl, job_id, positive_seconds
from harness.commands.context import store_of

EXIT_CODES = {"done": 0, "failed": 1, "cancelled": 3}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "wait", help="wait for a job to end (exit 0 done, 1 failed, 3 cancelled)")
    parser.add_argument("job", type=job_id, help="job id (`submit` and `run` print it)")
    parser.add_argument("--poll", type=positive_seconds, default=0.5,
                        help="seconds between looks (default %(default)s)")
    add_lease_ttl(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time

    from db.jobs import ACTIVE
    from harness.execution.leases import job_lost_after, lease_ttl

    lost_after = job_lost_after(lease_ttl(args.lease_ttl))
    with store_of(args, create=False) as store:
        job = store.jobs.get(args.job)
        while job.state in ACTIVE:
            time.sleep(args.poll)
            store.jobs.reap(lost_after)  # a dead coordinator's job ends here
            job = store.jobs.get(args.job)
    print(f"job {job.id} {job.state}: {job.message or ''}".rstrip())
    return EXIT_CODES[job.state]
