"""`benchfarm report EXPERIMENT`: the experiment's report (index.html, report.md, CSVs, manifest).

With ``--claims`` the audit of those claims, judged on stored runs only, is added as a section
(and written as audit.md); run `benchfarm audit` first to run what the claims need.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from db.store import Store
from devices.inventory import load_inventory
from harness.commands.audit import DEFAULT_MODEL, environment
from reports.audit import audit_section, load_claims, run_audit, write_audit
from reports.render import render_report


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("report", help="render an experiment's report")
    parser.add_argument("experiment", help="experiment name (see `benchfarm status`)")
    parser.add_argument("--out", help="output folder (default: reports/<experiment>)")
    parser.add_argument("--claims", action="append", default=[],
                        help="claims file(s) to audit on the stored runs and add as a section")
    parser.add_argument("--model", default=str(DEFAULT_MODEL),
                        help="the model this farm runs, for the audit (default: %(default)s)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out or Path("reports") / args.experiment)
    with Store.open(args.db) as store:
        sections = []
        if args.claims:
            env = environment(Path(args.model), load_inventory(None))
            verdicts = [v for path in args.claims
                        for v in run_audit(load_claims(path), store, env)]
            write_audit(out, "audit of published claims", verdicts)
            sections.append(audit_section("Audit of published claims", verdicts))
        index = render_report(store, args.experiment, out, extra_sections=sections)
    print(f"report: {index}")
    return 0
