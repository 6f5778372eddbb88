"""`benchfarm release NAME`: end a board's reservation now (`benchfarm reserve`)."""

from __future__ import annotations

import argparse
import getpass

from harness.commands.context import boards_of, store_of


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("release", help="end a board's reservation")
    parser.add_argument("names", nargs="+", metavar="NAME", help="device names or classes")
    parser.add_argument("--inventory", help="inventory TOML (default: as for `benchfarm run`)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    devices = boards_of(args)
    with store_of(args) as store:
        for device in devices:
            held = store.boards.release(device.name, getpass.getuser())
            print(f"{device.name}: " + (f"released (was reserved for {held.owner})" if held
                                        else "was not reserved"))
    return 0
