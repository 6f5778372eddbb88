"""`benchfarm queue`: the jobs (queued, running, and with --all the finished ones), the
board leases held now, and the boards that do not take everyone's work (not online, or
reserved)."""

from __future__ import annotations

import argparse

from harness.commands.arguments import add_paging, page_note
from harness.commands.context import store_of
from harness.commands.table import format_table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("queue", help="queued and running jobs, and board leases")
    parser.add_argument("--all", action="store_true", help="finished jobs too")
    add_paging(parser, "jobs", 200)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from db.jobs import ACTIVE

    with store_of(args, create=False, read_only=True) as store:
        states = None if args.all else ACTIVE
        jobs = store.jobs.list(states, args.limit or None, args.offset)
        total = store.jobs.count(states)
        leases = store.leases.active()
        boards = [s for s in store.boards.states().values() if s.state != "online"]
        reservations = store.boards.reservations()
    if jobs:
        print(format_table(
            ["job", "experiment", "state", "priority", "owner", "kind", "submitted (UTC)",
             "coordinator", "message"],
            [[j.id, j.experiment, j.state, j.priority, j.owner, j.kind,
              f"{j.submitted_at:%Y-%m-%d %H:%M:%S}", j.holder, j.message] for j in jobs]))
        note = page_note(len(jobs), args.offset, total, "jobs")
        if note:
            print(note)
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
    if boards or reservations:
        print("\nboards not taking everyone's work:")
        rows = [[s.board, s.state, s.reason, f"{s.since:%Y-%m-%d %H:%M}"] for s in boards]
        rows += [[r.board, f"reserved by {r.owner}", r.reason, f"until {r.ends:%Y-%m-%d %H:%M}"]
                 for r in reservations.values()]
        print(format_table(["board", "state", "reason", "since / until (UTC)"], rows))
    return 0
