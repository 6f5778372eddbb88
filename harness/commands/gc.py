"""`benchfarm gc [--boards] [--nodes] [--older-than D] [--dry-run] [--ray-address A]`: free
cache space.

Removes artifacts older than D (default 7d) that nothing references from the board caches
(every board of the inventory, or NAME...) and from this machine's node cache
($BENCHFARM_NODE_CACHE), or with --ray-address from every live node's of that cluster; never
what a queued or running job may need (harness.lab.housekeeping). Neither flag: both.
Reports the bytes freed (with --dry-run: that would be), per board and per node. A board that
cannot be reached or a node whose task fails is named with its error and the others are still
cleaned; the exit code is then 1.
"""

from __future__ import annotations

import argparse

from harness.commands.arguments import add_inventory, add_ray_address, duration
from harness.commands.context import inventory_of, store_of


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("gc", help="remove old unreferenced artifacts from the "
                                   "board and node caches")
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="boards or classes (default: every board of the inventory)")
    parser.add_argument("--boards", action="store_true", help="the board caches")
    parser.add_argument("--nodes", action="store_true", help="this machine's node cache (with "
                        "--ray-address: every node's of the cluster)")
    parser.add_argument("--older-than", type=duration, default=duration("7d"), metavar="D",
                        help="only artifacts older than this, e.g. 12h, 7d (default 7d)")
    parser.add_argument("--dry-run", action="store_true", help="say what would go; remove "
                        "nothing")
    add_inventory(parser)
    add_ray_address(parser, "clean the node cache of every live node of this Ray cluster "
                    "(default: only this machine's)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.lab.housekeeping import collect

    inventory = inventory_of(args)
    both = not (args.boards or args.nodes)
    boards = inventory.select(args.names) if args.boards or both else None
    with store_of(args) as store:
        done = collect(store, inventory, boards, args.nodes or both, args.older_than,
                       args.dry_run, args.ray_address)
    verb = "would free" if args.dry_run else "freed"
    for found in done.collected:
        print(f"{found.where}: {len(found.blobs)} blobs, {len(found.trees)} trees; {verb} "
              f"{found.bytes} bytes")
    for where, why in done.skipped.items():
        print(f"{where}: left alone ({why})")
    for where, error in done.failed.items():
        print(f"{where}: failed, nothing removed there: {error}")
    print(f"total: {verb} {done.bytes} bytes" + (f"; {len(done.failed)} failed"
                                                  if done.failed else ""))
    return 1 if done.failed else 0
