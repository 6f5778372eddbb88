"""`benchfarm audit CLAIMS.toml`: do published claims reproduce on this farm?

The claims file's experiments run what is missing (harness.verify.claims), then
``reports.audit`` judges each claim and grades what its verdict shows (reports.audit.grade);
``--stored-only`` runs, builds and writes nothing and judges on what the store already holds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness import DEFAULT_MODEL, REPO_ROOT
from harness.commands.arguments import (
    add_devices,
    add_inventory,
    add_measurements,
    add_ray_address,
    selection,
)
from harness.commands.context import caller_of, inventory_of, store_of


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("audit", help="audit published claims (claims/*.toml)")
    parser.add_argument("claims", help="claims file, e.g. claims/seed_000_sparse_topk.toml")
    parser.add_argument("--model", type=Path,
                        help="the model every claims experiment runs (default: the experiment's "
                             f"own `model`, else {DEFAULT_MODEL.relative_to(REPO_ROOT)})")
    add_devices(parser, "local")
    add_inventory(parser)
    add_measurements(parser)
    add_ray_address(parser)
    parser.add_argument("--stored-only", action="store_true",
                        help="run nothing; judge on the runs already stored")
    parser.add_argument("--out", help="write audit.md, audit.json and audit.html here")
    parser.add_argument("--json", action="store_true",
                        help="print the verdicts as a JSON list (claim, grade, verdict, kind, "
                             "units, precondition, measured, expected, evidence, reason ...) "
                             "instead of the table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.verify.claims import audit_claims
    from reports.audit import terminal_table
    from reports.audit.report import audit_json, write_audit
    from reports.outdir import output_dir

    if args.out:
        output_dir(args.out)  # refuse an unwritable --out before the audit runs anything
    inventory = inventory_of(args)
    with store_of(args) as store:
        verdicts = audit_claims(args.claims, store, inventory, args.model,
                                args.devices or ["local"], args.ray_address,
                                run_missing=not args.stored_only,
                                progress=sys.stderr if args.json else sys.stdout,
                                selection=selection(args),
                                caller=None if args.stored_only else caller_of(store))
    if args.out:
        written = write_audit(args.out, f"audit: {Path(args.claims).name}", verdicts)
        print(f"audit: {written}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        sys.stdout.write(audit_json(verdicts))
    else:
        print(terminal_table(verdicts))
    return 0
