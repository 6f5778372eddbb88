"""`benchfarm track SPEC --since REV`: run the spec on every new commit of engine/ (nightly)."""

from __future__ import annotations

import argparse
import sys

from db.store import Store
from devices.inventory import load_inventory
from harness.commands.flags import add_inventory, add_ray_address
from harness.history.measure import Measurer
from harness.history.track import track
from harness.spec import load_spec
from reports.history import METRICS


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "track", help="run a spec on every new commit of engine/ and report regressions")
    parser.add_argument("spec", help="the experiment spec (TOML)")
    parser.add_argument("--since", required=True,
                        help="the first revision to track (later runs pick up after the last "
                             "tracked commit)")
    parser.add_argument("--metric", default="decode_ms_per_token", choices=list(METRICS),
                        help="the metric whose regressions are reported (default: %(default)s)")
    parser.add_argument("--device", help="the device or class (default: the spec's first)")
    add_inventory(parser)
    add_ray_address(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    inventory = load_inventory(args.inventory)
    with Store.open(args.db) as store, \
            Measurer(spec, inventory, store, args.device or spec.devices[0],
                     args.ray_address) as measurer:
        result = track(measurer, args.since, args.metric,
                       lambda line: print(line, file=sys.stderr, flush=True))
    print(f"track: {len(result.new)} new revision(s) run, {len(result.skipped)} skipped, "
          f"{len(result.regressions)} regression(s); `benchfarm history {spec.name}` shows them")
    return 0
