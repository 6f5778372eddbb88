"""`benchfarm bisect SPEC --good REV --bad REV`: the first commit where a metric got worse."""

from __future__ import annotations

import argparse
import json
import sys

from harness.commands.arguments import add_measuring, add_threshold
from harness.commands.context import inventory_of, measuring, spec_of


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bisect", help="find the first commit where a metric got worse (builds only what the "
                       "search needs)")
    parser.add_argument("spec", help="the experiment spec (TOML) to measure each revision with")
    parser.add_argument("--good", required=True, help="a git revision where the metric is good")
    parser.add_argument("--bad", required=True, help="a later git revision where it is worse")
    add_measuring(parser, "the metric")
    add_threshold(parser, "relative change that counts as worse")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.history.bisect import bisect, bisect_range
    from harness.history.measure import history_paths

    spec, inventory = spec_of(args), inventory_of(args)
    span = bisect_range(args.good, args.bad, history_paths(spec))  # before anything is built
    with measuring(args, spec, inventory) as measurer:
        result = bisect(measurer, span, args.metric, args.threshold,
                        lambda line: print(line, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(result.document(), indent=2))
        return 0
    print(result.line(args.metric))
    if result.possibly:
        print("  the skipped commits leave it open: it may be any of "
              + ", ".join(c[:12] for c in result.possibly))
    return 0
