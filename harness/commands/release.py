"""`benchfarm release NAME`: end a board's reservation now (`benchfarm reserve`)."""

from __future__ import annotations

import argparse
import getpass


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("release", help="end a board's reservation")
    parser.add_argument("names", nargs="+", metavar="NAME", help="device names or classes")
    parser.add_argument("--inventory", help="inventory TOML (default: as for `benchfarm run`)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from db.store import Store
    from devices.inventory import load_inventory

    devices = load_inventory(args.inventory).select(args.names)
    with Store.open(args.db) as store:
        for device in devices:
            held = store.boards.release(device.name, getpass.getuser())
            print(f"{device.name}: " + (f"released (was reserved for {held.owner})" if held
                                        else "was not reserved"))
    return 0
