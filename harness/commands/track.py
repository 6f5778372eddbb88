"""`benchfarm track SPEC --since REV`: run the spec on every new commit of engine/ (nightly)."""

from __future__ import annotations

import argparse
import sys

from harness.commands.arguments import add_measuring, add_notify, add_threshold
from harness.commands.context import inventory_of, measuring, spec_of


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "track", help="run a spec on every new commit of engine/ and report regressions")
    parser.add_argument("spec", help="the experiment spec (TOML)")
    parser.add_argument("--since", required=True,
                        help="the first revision to track (later runs pick up after the last "
                             "tracked commit)")
    add_measuring(parser, "the metric whose regressions are reported")
    add_threshold(parser, "smallest relative step reported")
    add_notify(parser, "announce each regression here, besides the spec's [notify]")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.execution.notify import targets_from
    from harness.history.alerting import record_alerts, said
    from harness.history.track import regression_hook, track

    spec = spec_of(args)
    targets = targets_from(args.notify, spec.notify)
    with measuring(args, spec, inventory_of(args)) as measurer:
        result = track(measurer, args.since, args.metric, args.threshold,
                       lambda line: print(line, file=sys.stderr, flush=True),
                       regression_hook(targets))
        alerting = record_alerts(measurer.store, result.summaries, targets)
    for line in said(alerting):
        print(line)
    print(f"track: {len(result.new)} new revision(s) run, {len(result.skipped)} skipped, "
          f"{len(result.regressions)} regression(s); `benchfarm history {spec.name}` shows them")
    return 0
