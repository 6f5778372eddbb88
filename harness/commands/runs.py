"""`benchfarm runs list|show`: the stored runs, one per line, or everything about one and
every measurement of it."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from datetime import datetime

from db.records import RUN_STATUSES
from harness.commands.arguments import add_paging, page_note
from harness.commands.context import store_of
from harness.commands.table import format_table

ERROR_WIDTH = 60


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("runs", help="list stored runs or show one")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="one line per run")
    listing.add_argument("--experiment", help="only this experiment")
    listing.add_argument("--status", choices=RUN_STATUSES, help="only runs with this status")
    add_paging(listing, "runs", 200)
    listing.set_defaults(func=run_list)
    show = actions.add_parser("show", help="everything stored about one run and every "
                                           "measurement of it")
    show.add_argument("run", help="run id or run key")
    show.add_argument("--full", action="store_true",
                      help="include the workload token ids and every decode step's timing")
    show.add_argument("--json", action="store_true",
                      help="one JSON object; its \"measurements\" list holds every attempt "
                           "(status, times, device snapshots, timings, outcome)")
    show.set_defaults(func=run_show)


def run_list(args: argparse.Namespace) -> int:
    with store_of(args, create=False, read_only=True) as store:
        runs = store.list_runs(args.experiment, args.status, args.limit or None, args.offset)
        total = store.count_runs(args.experiment, args.status)
    if not runs:
        print("no runs match" + (f" from --offset {args.offset} ({total} in all)"
                                 if total else ""))
        return 0
    print(format_table(
        ["id", "key", "experiment", "device", "revision", "command", "policy", "k", "rep",
         "status", "tries", "decode ms/tok", "recall", "error"],
        [[r.id, r.run_key[:12], r.experiment, r.device, short_revision(r.revision), r.command,
          r.policy, r.k, r.repeat, r.status, r.measurements, r.decode_ms_per_token, r.recall,
          last_line(r.error)]
         for r in runs],
    ))
    note = page_note(len(runs), args.offset, total, "runs")
    if note:
        print(note)
    return 0


def short_revision(revision: str | None) -> str | None:
    """A commit cut to 12 characters, keeping a ``+dirty`` mark."""
    if revision is None:
        return None
    commit, plus, rest = revision.partition("+")
    return commit[:12] + plus + rest


def last_line(error: str | None) -> str | None:
    """The last non-empty line of an error (the engine's one-line message), shortened."""
    lines = [line for line in (error or "").splitlines() if line.strip()]
    return lines[-1].strip()[:ERROR_WIDTH] if lines else None


def _json_default(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot encode {type(value).__name__}")


def run_show(args: argparse.Namespace) -> int:
    from reports.roofline import limits_of, share_text, shares_of

    with store_of(args, create=False, read_only=True) as store:
        detail = asdict(store.get_run(args.run))
        limits = store.board_limits([detail["device"]["name"]])
    shares = shares_of((detail["model"] or {}).get("config"), detail["run"],
                       limits_of(limits.get(detail["device"]["name"])))
    detail["roofline_share"] = shares
    # each measurement as one object: its columns, outcome, snapshots and timings
    detail["measurements"] = [m.pop("measurement") | m for m in detail["measurements"]]
    if not args.full:
        # Summaries instead of the long lists; --full prints them.
        if detail["workload"] is not None:
            detail["workload"]["ids"] = f"{len(detail['workload']['ids'])} token ids"
        for part in (detail, *detail["measurements"]):
            part["token_timings"] = f"{len(part['token_timings'])} decode steps"
        for row in (detail["run"], *detail["measurements"]):
            row["raw_json"] = (None if row["raw_json"] is None
                               else f"{len(row['raw_json'])} characters")
    if args.json:
        print(json.dumps(detail, indent=2, sort_keys=True, default=_json_default))
        return 0
    run, build = detail["run"], detail["build"] or {}
    print(f"run {run['id']}  {run['run_key']}\n"
          f"experiment {detail['experiment']}; {run['engine']} {run['command']} on "
          f"{detail['device']['name']}; revision {build.get('revision')}; build "
          f"{build.get('target')} {build.get('isa') or '(level not recorded)'}; "
          f"repeat {run['repeat']}\n"
          f"config {json.dumps(run['config'], sort_keys=True)}\n"
          f"status {run['status']} (measurement {run['measurement_id']}, what reports use)\n"
          f"share of the board's roofline: decode {share_text(shares['decode_ms_per_token'])}, "
          f"prefill {share_text(shares['prefill_ms'])}\n")
    print(format_table(
        ["id", "attempt", "status", "lease", "started", "finished", "decode ms/tok", "wall ms",
         "error"],
        [[m["id"], m["attempt"], m["status"], "expired" if m["lease_expired"] else "",
          _moment(m["started_at"]), _moment(m["finished_at"]), m["decode_ms_per_token"],
          m["wall_ms"], last_line(m["error"])]
         for m in detail["measurements"]]))
    return 0


def _moment(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(sep=" ", timespec="seconds")
