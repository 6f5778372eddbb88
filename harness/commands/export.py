"""`benchfarm export EXPERIMENT --format csv|parquet`: the raw rows, one file per table."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING

from harness.commands.arguments import add_measurements, selection
from harness.commands.context import store_of
from harness.errors import InputError

if TYPE_CHECKING:
    from db.measurements import Selection
    from db.store import Store

FORMATS = ("csv", "parquet")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export", help="write an experiment's runs, token timings, outcomes and snapshots")
    parser.add_argument("experiment", help="experiment name")
    parser.add_argument("--format", choices=FORMATS, default="csv")
    parser.add_argument("--out", help="output folder (default: export/EXPERIMENT)")
    add_measurements(parser)
    parser.set_defaults(func=run)


def export(store: Store, experiment: str, fmt: str, out_dir: Path,
           chosen: Selection | None = None) -> dict[Path, int]:
    """Write ``out_dir/<table>.<fmt>`` for every frame of the experiment: {path: rows}
    (``chosen``: which measurements; default each run's latest ok one)."""
    from reports.tables import safe_cells

    if fmt not in FORMATS:
        raise InputError(f"export format {fmt!r}: allowed {', '.join(FORMATS)}")
    frames = store.frames(experiment, chosen)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {out_dir}: cannot create the folder ({exc.strerror})") from exc
    written = {}
    for name, frame in frames.items():
        path = out_dir / f"{name}.{fmt}"
        if fmt == "csv":
            safe_cells(frame).to_csv(path, index=False)
        else:
            frame.to_parquet(path, index=False)
        written[path] = len(frame)
    return written


def run(args: argparse.Namespace) -> int:
    # Experiment names become folder names: keep them to safe characters.
    out_dir = Path(args.out or Path("export") / re.sub(r"[^A-Za-z0-9._-]+", "_", args.experiment))
    with store_of(args, create=False, read_only=True) as store:
        written = export(store, args.experiment, args.format, out_dir, selection(args))
    for path, rows in written.items():
        print(f"{path}  ({rows} rows)")
    return 0
