"""`benchfarm runs list|show`: the stored runs, one per line, or everything about one."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from datetime import datetime

from db.records import RUN_STATUSES
from harness.commands.table import format_table

ERROR_WIDTH = 60


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("runs", help="list stored runs or show one")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="one line per run")
    listing.add_argument("--experiment", help="only this experiment")
    listing.add_argument("--status", choices=RUN_STATUSES, help="only runs with this status")
    listing.set_defaults(func=run_list)
    show = actions.add_parser("show", help="everything stored about one run, as JSON")
    show.add_argument("run", help="run id or run key")
    show.add_argument("--full", action="store_true",
                      help="include the workload token ids and every decode step's timing")
    show.set_defaults(func=run_show)


def run_list(args: argparse.Namespace) -> int:
    from db.store import Store

    with Store.open(args.db, create=False) as store:
        runs = store.list_runs(args.experiment, args.status)
    if not runs:
        print("no runs match")
        return 0
    print(format_table(
        ["id", "key", "experiment", "device", "command", "policy", "k", "rep", "status",
         "decode ms/tok", "recall", "error"],
        [[r.id, r.run_key[:12], r.experiment, r.device, r.command, r.policy, r.k, r.repeat,
          r.status, r.decode_ms_per_token, r.recall,
          last_line(r.error)]
         for r in runs],
    ))
    return 0


def last_line(error: str | None) -> str | None:
    """The last non-empty line of an error (the engine's one-line message), shortened."""
    lines = [line for line in (error or "").splitlines() if line.strip()]
    return lines[-1].strip()[:ERROR_WIDTH] if lines else None


def _json_default(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot encode {type(value).__name__}")


def run_show(args: argparse.Namespace) -> int:
    from db.store import Store

    with Store.open(args.db, create=False) as store:
        detail = asdict(store.get_run(args.run))
    if not args.full:
        # Summaries instead of the long lists; --full prints them.
        if detail["workload"] is not None:
            detail["workload"]["ids"] = f"{len(detail['workload']['ids'])} token ids"
        detail["token_timings"] = f"{len(detail['token_timings'])} decode steps"
        detail["run"]["raw_json"] = (None if detail["run"]["raw_json"] is None
                                     else f"{len(detail['run']['raw_json'])} characters")
    print(json.dumps(detail, indent=2, sort_keys=True, default=_json_default))
    return 0
