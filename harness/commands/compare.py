"""`benchfarm compare A B`: devices, device classes or engine revisions, config by config."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from harness.commands.arguments import add_measurements, selection
from harness.commands.context import store_of
from reports.metrics import TIMINGS

if TYPE_CHECKING:
    from db.store import Store


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare", help="compare two devices, classes or revisions (A A: the noise floor)")
    parser.add_argument("a", help="device name, device class, engine, or engine revision: any "
                             "git name (branch, tag, sha, HEAD~2), `worktree`, a source hash")
    parser.add_argument("b", help="the same kind as A; A again for the A/A noise floor")
    parser.add_argument("--experiment", action="append",
                        help="limit to this experiment (repeatable; default: all)")
    parser.add_argument("--metric", default="decode_ms_per_token",
                        help=f"timing to compare: {', '.join(TIMINGS)} (default: %(default)s)")
    parser.add_argument("--threshold", type=float,
                        help="relative change below which a difference is noise "
                             "(default: reports.stats.NOISE_THRESHOLD, 0.05; raised to the A/A "
                             "noise floor)")
    parser.add_argument("--lmc-policy", default="exact",
                        help="comparing engines: the lmc attention policy set against the other "
                             "engine (default: exact, what other engines compute)")
    parser.add_argument("--out", help="also write compare.html, compare.md and compare.csv here")
    add_measurements(parser)
    parser.set_defaults(func=run)


def revision_names(*texts: str, store: Store | None = None) -> dict[str, str]:
    """What each text names as an engine revision: ``worktree`` the working tree's engine
    sources (their hash), a git name the commit it resolves to. With ``store``, a commit
    whose binary the store names otherwise (revisions with the same engine sources share one
    build row, under one of their names) becomes that name; so does a commit that leaves the
    sources alone, by the last commit that changed them."""
    from harness import ENGINE_DIR
    from harness.engines.lmc.build import SOURCE_PATHS, source_hash
    from harness.history.revisions import engine_revision, try_resolve
    from harness.identity import DIRTY, WORKTREE

    named = {}
    for text in texts:
        if text == WORKTREE:
            named[text] = source_hash(ENGINE_DIR)
            continue
        commit = try_resolve(text, SOURCE_PATHS)
        if not commit:
            continue
        named[text] = commit
        if store is not None and not commit.endswith(DIRTY):
            candidates = [commit, engine_revision(commit, SOURCE_PATHS)]
            known = store.builds_named(candidates)
            named[text] = next((known[c] for c in candidates if c in known), commit)
    return named


def run(args: argparse.Namespace) -> int:
    from reports.compare import compare, terminal_table, write_comparison
    from reports.metrics import NOISE_THRESHOLD

    threshold = NOISE_THRESHOLD if args.threshold is None else args.threshold
    with store_of(args) as store:
        result = compare(store, args.a, args.b, args.experiment, args.metric, threshold,
                         args.lmc_policy, selection(args),
                         revision_names(args.a, args.b, store=store))
    print(terminal_table(result))
    if args.out:
        print(f"compare: {write_comparison(result, args.out)}")
    return 0
