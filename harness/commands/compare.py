"""`benchfarm compare A B`: devices, device classes or engine revisions, config by config."""

from __future__ import annotations

import argparse

from db.store import Store
from harness.commands.flags import add_measurements, selection
from reports.compare import compare, terminal_table, write_comparison
from reports.stats import NOISE_THRESHOLD


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare", help="compare two devices, classes or revisions (A A: the noise floor)")
    parser.add_argument("a", help="device name, device class, or engine revision / source hash")
    parser.add_argument("b", help="the same kind as A; A again for the A/A noise floor")
    parser.add_argument("--experiment", action="append",
                        help="limit to this experiment (repeatable; default: all)")
    parser.add_argument("--metric", default="decode_ms_per_token",
                        help="timing to compare (default: %(default)s; also attn_ms_per_token, "
                             "prefill_ms, attn_median_ms, engine_ms)")
    parser.add_argument("--threshold", type=float, default=NOISE_THRESHOLD,
                        help="relative change below which a difference is noise "
                             "(default: %(default)s; raised to the A/A noise floor)")
    parser.add_argument("--lmc-policy", default="exact",
                        help="comparing engines: the lmc attention policy set against the other "
                             "engine (default: exact, what other engines compute)")
    parser.add_argument("--out", help="also write compare.html, compare.md and compare.csv here")
    add_measurements(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with Store.open(args.db) as store:
        result = compare(store, args.a, args.b, args.experiment, args.metric, args.threshold,
                         args.lmc_policy, selection(args))
    print(terminal_table(result))
    if args.out:
        print(f"compare: {write_comparison(result, args.out)}")
    return 0
