"""`benchfarm submit SPEC`: queue an experiment for `benchfarm serve`, and return at once."""

from __future__ import annotations

import argparse
import getpass
from pathlib import Path

from db.store import Store
from harness.commands.flags import add_devices
from harness.spec import load_spec


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "submit", help="queue an experiment for `benchfarm serve` (validated now, run later)")
    parser.add_argument("spec", help="the experiment spec (TOML); it is stored as it is now")
    parser.add_argument("--priority", type=int, default=0,
                        help="higher runs first (default %(default)s; ties: first submitted)")
    parser.add_argument("--owner", default=getpass.getuser(),
                        help="who asked for it (default: your user name, %(default)s)")
    add_devices(parser)
    parser.add_argument("--force", action="store_true", help="redo runs already stored as ok")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    with Store.open(args.db) as store:
        job_id = store.jobs.add(spec.name, str(Path(args.spec).resolve()), spec.text,
                                owner=args.owner, devices=args.devices, force=args.force,
                                priority=args.priority)
    print(f"queued job {job_id}: experiment {spec.name} (priority {args.priority}, owner "
          f"{args.owner}); `benchfarm serve` runs it, `benchfarm queue` shows it")
    return 0
