"""`benchfarm demo`: the embedded default, end to end.

On this machine only (device `local`), a local Ray instance and the SQLite store: build the
engine, run the demo matrix (specs/demo.toml: needle at 512/1024/2048 tokens x exact / sparse k in
{1, 4, 8, 16, 32}) with the shipped model, then render the report (which opens with what the runs
show about sparse attention).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from harness import REPO_ROOT
from harness.commands.context import caller_of, spec_of, store_of
from reports.outdir import default_report_dir

if TYPE_CHECKING:
    import pandas as pd

    from db.store import Store

DEMO_SPEC = REPO_ROOT / "specs" / "demo.toml"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo", help="build lmc, run the demo needle matrix locally and report it")
    parser.add_argument("--spec", default=str(DEMO_SPEC),
                        help="the matrix to run (default: %(default)s)")
    parser.add_argument("--out", default=str(default_report_dir("demo")),
                        help="report folder (default: %(default)s)")
    parser.add_argument("--force", action="store_true", help="redo runs already stored as ok")
    parser.set_defaults(func=run)


SUMMARY_TITLE = ("needle recall and decode speed per context length (recall: mean; ms/token: "
                 "median [min, max] over the runs, every depth and repeat of the cell; x exact: "
                 "the median against exact's at the same length)")


def summary_table(store: Store, experiment: str) -> pd.DataFrame:
    """Needle recall and decode speed per (device, context length, policy, k), from the stored
    rows: context lengths are never pooled (a k that covers a short context is slower than
    exact there, and faster at the longest)."""
    import pandas as pd

    from reports.runs import load_experiment
    from reports.stats import summarize

    runs = load_experiment(store, experiment).runs
    if runs.empty:
        return runs
    runs = runs.assign(k=runs["k"].astype("Int64"))
    rows = []
    for (device, ctx, policy, k), cell in runs.groupby(["device", "ctx", "policy", "k"],
                                                       sort=True, dropna=False):
        ok = cell[cell["status"] == "ok"]
        decode = summarize(ok["decode_ms_per_token"].tolist())
        attn = summarize(ok["attn_ms_per_token"].tolist())
        rows.append({"device": device, "ctx": None if pd.isna(ctx) else int(ctx),
                     "policy": policy, "k": k,
                     "runs": len(cell), "ok": len(ok), "recall": round(ok["recall"].mean(), 3),
                     "decode_ms/token": decode.text(3) if decode else "",
                     "attn_ms/token": attn.text(3) if attn else "",
                     "median": decode.median if decode else None})
    table = pd.DataFrame(rows)
    exact = {(r.device, r.ctx): r.median for r in table.itertuples() if r.policy == "exact"}
    table["x exact"] = [f"{m / exact[(d, c)]:.2f}" if m and exact.get((d, c)) else ""
                        for d, c, m in zip(table["device"], table["ctx"], table["median"],
                                           strict=True)]
    return table.drop(columns="median")


def run(args: argparse.Namespace) -> int:
    from devices.inventory import LOCAL, Inventory, local_device
    from harness.execution.coordinator import RunRequest, run_experiment
    from reports.render import render_report

    spec = spec_of(args)
    inventory = Inventory({LOCAL: local_device()})  # the demo never reaches other machines
    with store_of(args) as store:
        summary = run_experiment(RunRequest(spec, inventory, [LOCAL], args.force,
                                            caller=caller_of(store)), store)
        print(summary.line())
        print(SUMMARY_TITLE)
        print(summary_table(store, spec.name).to_string(index=False))
        print(f"report: {render_report(store, spec.name, Path(args.out))}")
    return 0 if summary.succeeded else 1
