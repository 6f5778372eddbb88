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


def summary_table(store: Store, experiment: str) -> pd.DataFrame:
    """Needle recall and decode speed per (device, policy, k), from the stored rows."""
    import pandas as pd

    frames = store.frames(experiment)
    runs = frames["runs"]
    if runs.empty:
        return runs
    outcomes = frames["outcomes"][["measurement_id", "recall"]]
    rows = runs.merge(outcomes, on="measurement_id", how="left")
    rows["k"] = rows["k"].astype("Int64")
    grouped = rows.groupby(["device_name", "policy", "k"], sort=True, dropna=False)
    table = pd.DataFrame({
        "runs": grouped.size(),
        "ok": grouped["status"].apply(lambda s: int((s == "ok").sum())),
        "recall": grouped["recall"].mean().round(3),
        "decode_ms/token": grouped["decode_ms_per_token"].median().round(3),
        "attn_ms/token": grouped["attn_ms_per_token"].median().round(3),
    })
    return table.reset_index()


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
        print(summary_table(store, spec.name).to_string(index=False))
        print(f"report: {render_report(store, spec.name, Path(args.out))}")
    return 0 if summary.succeeded else 1
