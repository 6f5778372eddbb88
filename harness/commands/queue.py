"""`benchfarm queue`: the jobs (queued, running, and with --all the finished ones) and the
board leases held now."""

from __future__ import annotations

import argparse

from db.jobs import ACTIVE
from db.store import Store
from harness.commands.table import format_table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("queue", help="queued and running jobs, and board leases")
    parser.add_argument("--all", action="store_true", help="finished jobs too")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with Store.open(args.db, create=False) as store:
        jobs = store.jobs.list(None if args.all else ACTIVE)
        leases = store.leases.active()
    if jobs:
        print(format_table(
            ["job", "experiment", "state", "priority", "owner", "kind", "submitted (UTC)",
             "coordinator", "message"],
            [[j.id, j.experiment, j.state, j.priority, j.owner, j.kind,
              f"{j.submitted_at:%Y-%m-%d %H:%M:%S}", j.holder, j.message] for j in jobs]))
    else:
        print("no jobs" + ("" if args.all else " queued or running") +
              "; `benchfarm submit SPEC` queues one")
    if leases:
        print("\nboard leases:")
        print(format_table(
            ["board", "holder", "experiment", "run", "expires (UTC)"],
            [[lease.board, lease.holder, lease.experiment,
              (lease.run_key or "warm-up")[:12], f"{lease.expires:%H:%M:%S}"]
             for lease in leases]))
    return 0
