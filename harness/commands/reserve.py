"""`benchfarm reserve NAME --for DURATION [--reason TEXT] [--owner NAME]`: keep a board for
your own jobs.

Until the reservation ends or `benchfarm release NAME`, the board runs only its holder's jobs
(`run` and `serve` leave it to them; others' jobs wait, and `queue` says why). Reserving a
board you hold already changes its end. ``--owner NAME`` reserves (or changes) a board for
someone else: admins only, recorded as done by the admin for NAME.
"""

from __future__ import annotations

import argparse

from harness.commands.arguments import MAX_TEXT_CHARS, duration, free_text
from harness.commands.context import boards_of, caller_of, store_of


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("reserve", help="keep a board for your jobs for a while")
    parser.add_argument("names", nargs="+", metavar="NAME", help="device names or classes")
    parser.add_argument("--for", dest="seconds", type=duration, required=True,
                        metavar="DURATION", help="how long, e.g. 90m, 2h, 1d")
    parser.add_argument("--reason", type=free_text, help="why (shown by `devices list` and "
                        f"`queue`; at most {MAX_TEXT_CHARS} characters)")
    parser.add_argument("--owner", metavar="NAME",
                        help="whose jobs may use it (default: yours; someone else's: admins "
                             "only, recorded)")
    parser.add_argument("--inventory", help="inventory TOML (default: as for `benchfarm run`)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from db.leases import utcnow

    devices = boards_of(args)
    ends = utcnow() + timedelta(seconds=args.seconds)
    with store_of(args) as store:
        caller = caller_of(store)
        acting_for = caller.as_owner(args.owner)
        owner = acting_for or caller.name
        for device in devices:
            event = caller.event("reserve", f"board {device.name}", acting_for,
                                 f"until {ends:%Y-%m-%d %H:%M:%S} UTC"
                                 + (f": {args.reason}" if args.reason else ""))
            held = store.boards.reserve(device.name, owner, ends, args.reason, event)
            print(f"{device.name}: reserved for {held.owner} until {held.ends:%Y-%m-%d %H:%M} "
                  "UTC; `benchfarm release " + device.name + "` ends it")
    return 0
