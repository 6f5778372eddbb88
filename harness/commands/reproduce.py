"""`benchfarm reproduce RUN`: re-run a stored run with the identical binary and inputs."""

from __future__ import annotations

import argparse

from harness.commands.arguments import add_inventory
from harness.commands.context import inventory_of, store_of


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "reproduce", help="re-run a stored run (same device, binary, inputs) and compare")
    parser.add_argument("run", help="run id or run key (see `benchfarm runs list`)")
    add_inventory(parser)
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds the engine may run (default: %(default)s)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when the run came out identical (or has no output to compare), 1 otherwise."""
    from harness.verify.reproduce import reproduce

    with store_of(args) as store:
        result = reproduce(store, args.run, inventory_of(args), args.timeout)
    print(result.text())
    return 0 if result.status == "ok" and result.identical is not False else 1
