"""`benchfarm history EXPERIMENT`: a metric per engine revision in commit order, per device
and config, with the steps beyond noise (reports.steps) named by their commits."""

from __future__ import annotations

import argparse
import json
import sys
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

from harness.commands.arguments import add_notify, add_threshold
from harness.commands.context import store_of
from harness.errors import InputError
from reports.metrics import METRICS

if TYPE_CHECKING:
    from db.store import Store
    from reports.history import History


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "history", help="a metric across engine revisions, with the commits that changed it")
    parser.add_argument("experiment", help="experiment name (see `benchfarm status`)")
    parser.add_argument("--metric", default="decode_ms_per_token", choices=list(METRICS),
                        help="the metric (default: %(default)s)")
    parser.add_argument("--device", action="append", help="only this device (repeatable)")
    parser.add_argument("--config", action="append",
                        help="only this config, as the table names it, e.g. 'decode ctx=128 "
                             "exact t=1' (repeatable)")
    add_threshold(parser, "smallest relative step reported")
    parser.add_argument("--out", help="also write history.json and history.html (timelines)")
    parser.add_argument("--json", action="store_true",
                        help='print {"series": [...], "steps": [...], "commits": [...]} as JSON')
    parser.add_argument("--record", action="store_true",
                        help="store each commit with a regression as an alert (`benchfarm "
                             "alerts`), and suggest the fix of those its series are back from")
    add_notify(parser, "with --record: announce the alerts opened and changed here")
    parser.set_defaults(func=run)


def load_history(store: Store, experiment: str, metric: str, devices: list[str] | None,
                 configs: list[str] | None, threshold: float) -> History:
    from harness.identity import commit_order
    from reports.history import first_run_order, history, revision_runs
    from reports.steps import StepParams

    runs = revision_runs(store, experiment)
    known = sorted({r.config for r in runs})
    for config in configs or []:
        if config not in known:
            raise InputError(f"--config {config!r}: experiment {experiment!r} has no such config; "
                             f"its configs: {'; '.join(known) or 'none'}")
    for device in devices or []:
        if device not in {r.device for r in runs}:
            raise InputError(f"--device {device!r}: no ok run of {experiment!r} on it")
    return history(runs, commit_order(first_run_order(runs)), metric, devices,
                   configs, StepParams(threshold=threshold), cache=store)


def run(args: argparse.Namespace) -> int:
    from harness.history.revisions import commit_info
    from reports.commits import commit_summaries, summary_text
    from reports.outdir import output_dir

    with store_of(args, create=False) as store:
        result = load_history(store, args.experiment, args.metric, args.device, args.config,
                              args.threshold)
        info = commit_info(result.revisions)
        if args.record:
            from harness.execution.notify import targets_from
            from harness.history.alerting import record_alerts, said

            for line in said(record_alerts(store, commit_summaries(result, info),
                                           targets_from(args.notify))):
                print(line, file=sys.stderr)
    document = result.document() | {"commits": [s.document()
                                                for s in commit_summaries(result, info)]}
    if args.out:
        out = output_dir(args.out)
        (out / "history.json").write_text(json.dumps(document, indent=2) + "\n")
        write_page(result, out / "history.html", summary_text(result, info))
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(summary_text(result, info))
        if args.out:
            print(f"history: {Path(args.out) / 'history.html'}")
    return 0


def write_page(result: History, path: Path, text: str) -> None:
    from reports.history import timeline_figures
    from reports.tables import CSS

    title = f"benchfarm history: {result.experiment}, {result.metric}"
    figures = "".join(f"<figure>{svg}<figcaption>{escape(caption)}</figcaption></figure>"
                      for caption, svg in timeline_figures(result))
    path.write_text(f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>"
                    f"{escape(title)}</title><style>{CSS}</style></head>\n<body>\n<h1>"
                    f"{escape(title)}</h1>\n<div class=\"figs\">{figures}</div>\n<pre>"
                    f"{escape(text)}</pre>\n</body></html>\n", encoding="utf-8")
