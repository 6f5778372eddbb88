"""`benchfarm predictor study FILE`: the eviction-prediction article's attention predictor on a
model, end to end.

Dumps key features from exact ``lmc ppl`` runs, trains every feature set per layer, ranks
held-out keys with them and the baselines, runs lmc's policies at the study's KV budgets, and
writes OUT/predictor-<set>.gbm (for ``lmc --attn gbm --predictor``), OUT/study.json and
OUT/index.md (see harness/predictor/study.py for the study file).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("predictor", help="train and evaluate the attention predictor")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    study = actions.add_parser("study", help="train, rank, run the budgets, write the report")
    study.add_argument("study", type=Path, help="study file (e.g. specs/studies/predictor.toml)")
    study.add_argument("--out", type=Path,
                       help="output directory (default out/reports/<name>)")
    study.add_argument("--lmc", help="lmc binary (default: build it for this machine)")
    study.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.engines.lmc.build import build_engine
    from harness.predictor.study import load_study, run_study
    from reports.outdir import default_report_dir

    study = load_study(args.study)
    out = args.out or default_report_dir(study.name)
    lmc = [args.lmc] if args.lmc else [build_engine().binary]
    run_study(study, lmc, out)
    print((out / "index.md").read_text(), end="")
    print(f"wrote {out / 'index.md'} and {out / 'study.json'}")
    return 0
