"""`benchfarm wait JOB`: block until the job ends; exit 0 done, 1 failed, 3 cancelled."""

from __future__ import annotations

import argparse

from harness.commands.arguments import positive_seconds
from harness.commands.context import store_of

EXIT_CODES = {"done": 0, "failed": 1, "cancelled": 3}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "wait", help="wait for a job to end (exit 0 done, 1 failed, 3 cancelled)")
    parser.add_argument("job", type=int, help="job id (`submit` and `run` print it)")
    parser.add_argument("--poll", type=positive_seconds, default=0.5,
                        help="seconds between looks (default %(default)s)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time

    from db.jobs import ACTIVE

    with store_of(args, create=False) as store:
        job = store.jobs.get(args.job)
        while job.state in ACTIVE:
            time.sleep(args.poll)
            job = store.jobs.get(args.job)
    print(f"job {job.id} {job.state}: {job.message or ''}".rstrip())
    return EXIT_CODES[job.state]
