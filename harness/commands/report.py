"""`benchfarm report EXPERIMENT`: the experiment's report (index.html, report.md, CSVs, manifest).

With ``--claims`` the audit of those claims, judged on stored runs only (nothing runs), is added
as a section and written as audit.md; run `benchfarm audit` first to run what the claims need.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness import DEFAULT_MODEL, REPO_ROOT
from harness.commands.arguments import add_devices, add_inventory, add_measurements, selection
from harness.commands.context import inventory_of, store_of
from reports.revisions import NEWEST_REVISIONS


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("report", help="render an experiment's report")
    parser.add_argument("experiment", help="experiment name (see `benchfarm status`)")
    parser.add_argument("--out", help="output folder (default: out/reports/<experiment>)")
    parser.add_argument("--claims", action="append", default=[],
                        help="claims file(s) to audit on the stored runs, added as a section")
    parser.add_argument("--model", type=Path,
                        help="the model the claims were run with (default: each claims "
                             "experiment's own `model`, else "
                             f"{DEFAULT_MODEL.relative_to(REPO_ROOT)})")
    parser.add_argument("--revisions", type=revision_count, default=NEWEST_REVISIONS,
                        metavar="N|all",
                        help="how many of the newest engine revisions the sections below the "
                             "history show in full (default: %(default)s; the history follows "
                             "every revision and runs.csv holds every run)")
    add_devices(parser, help_text="the devices the claims were run on (default: local)")
    add_inventory(parser)
    add_measurements(parser)
    parser.set_defaults(func=run)


def revision_count(text: str) -> int | None:
    """``--revisions``: a count of 1 or more, or ``all`` (None)."""
    if text == "all":
        return None
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of revisions (1 or more) "
                                         "or all")
    return count


def run(args: argparse.Namespace) -> int:
    from harness.identity import commit_order
    from harness.verify.claims import audit_claims
    from reports.audit import audit_section, write_audit
    from reports.outdir import default_report_dir
    from reports.render import render_report

    out = Path(args.out) if args.out else default_report_dir(args.experiment)
    with store_of(args) as store:
        sections = []
        if args.claims:
            inventory = inventory_of(args)
            verdicts = [v for path in args.claims
                        for v in audit_claims(path, store, inventory, args.model,
                                              args.devices or ["local"], run_missing=False)]
            write_audit(out, "audit of published claims", verdicts)
            sections.append(audit_section("Audit of published claims", verdicts))
        index = render_report(store, args.experiment, out, extra_sections=sections,
                              revision_order=commit_order, selection=selection(args),
                              revisions=args.revisions)
    print(f"report: {index}")
    return 0
