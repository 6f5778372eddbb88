"""`benchfarm logs JOB`: a job's story: every event of the job (submitted, claimed by which
serve, waiting and why, drained, requeued, interrupted, taken over, cancelled by whom,
finished) and every attempt at its runs (started, ended), in the order they happened, in UTC
(harness.lab.story); then its attempts as a table."""

from __future__ import annotations

import argparse

from harness.commands.arguments import job_id
from harness.commands.context import store_of
from harness.commands.table import format_table, shown


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("logs", help="a job's story: its events and its runs, in "
                                                "order")
    parser.add_argument("job", type=job_id, help="job id (`submit` and `run` print it)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.lab.story import ERROR_WIDTH, job_story, run_label

    with store_of(args, create=False, read_only=True) as store:
        story = job_story(store, args.job)
    job = story.job
    print(f"job {job.id}: experiment {job.experiment}, owner {shown(job.owner)}, priority "
          f"{job.priority}, {job.kind}, now {job.state}")
    width = max((len(line.what) for line in story.lines), default=0)
    for line in story.lines:
        print(f"  {line.stamp}  {line.what:<{width}}  {shown(line.detail)}")
    if job.message:
        print(f"  message: {shown(job.message)}")
    if story.attempts:
        counts = ", ".join(f"{n} {status}" for status, n in sorted(story.counts().items()))
        print(f"\nits attempts ({len(story.attempts)}: {counts}):")
        print(format_table(
            ["started (UTC)", "ended (UTC)", "run", "attempt", "board and config", "status",
             "error"],
            [[f"{a.started_at:%H:%M:%S}" if a.started_at else None,
              f"{a.finished_at:%H:%M:%S}" if a.finished_at else None, a.run_id, a.attempt,
              run_label(a), a.status,
              (a.error or "").strip().splitlines()[-1][:ERROR_WIDTH] if a.error else None]
             for a in story.attempts]))
    return 0
