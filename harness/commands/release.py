"""`benchfarm release NAME [--force]`: end a board's reservation now (`benchfarm reserve`).

Your own reservation, or with ``--force`` someone else's: admins only, recorded as done by the
admin for its owner. The check is made on the reservation in force when it is released.
"""

from __future__ import annotations

import argparse

from harness.commands.context import boards_of, caller_of, store_of


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("release", help="end a board's reservation")
    parser.add_argument("names", nargs="+", metavar="NAME", help="device names or classes")
    parser.add_argument("--force", action="store_true",
                        help="release another owner's reservation (admins only; recorded)")
    parser.add_argument("--inventory", help="inventory TOML (default: as for `benchfarm run`)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from db.audit import AuditEvent
    from db.boards import ReservationInfo

    devices = boards_of(args)
    with store_of(args) as store:
        caller = caller_of(store)
        for device in devices:
            def allowed(held: ReservationInfo, board: str = device.name) -> AuditEvent:
                acting_for = caller.acting_for(held.owner, f"the reservation of {board}",
                                               "release", forced=args.force)
                return caller.event("release", f"board {board}", acting_for,
                                    f"reserved until {held.ends:%Y-%m-%d %H:%M:%S} UTC")

            held = store.boards.release(device.name, caller.name, allowed)
            print(f"{device.name}: " + (f"released (was reserved for {held.owner})" if held
                                        else "was not reserved"))
    return 0
