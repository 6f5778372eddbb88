"""`benchfarm cancel EXPERIMENT`: drop its queued jobs and stop its running ones."""

from __future__ import annotations

import argparse

from db.errors import StoreInputError
from db.store import Store


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "cancel", help="cancel an experiment's queued and running jobs (in-flight runs are "
                       "stored as cancelled)")
    parser.add_argument("experiment", help="experiment name (see `benchfarm queue`)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with Store.open(args.db, create=False) as store:
        ids = store.jobs.cancel(args.experiment)
    if not ids:
        raise StoreInputError(f"experiment {args.experiment!r} has no queued or running job; "
                              "`benchfarm queue` lists them")
    print(f"cancelled job{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))} of "
          f"{args.experiment}; a running coordinator stops it within a second or two")
    return 0
