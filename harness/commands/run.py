"""`benchfarm run SPEC`: run an experiment matrix on the farm; resumable."""

from __future__ import annotations

import argparse

from db.store import Store
from devices.inventory import load_inventory
from harness.coordinator import Coordinator, run_experiment
from harness.sharing import lease_ttl, positive_seconds
from harness.spec import load_spec


def device_list(text: str) -> list[str]:
    return [item for item in text.split(",") if item]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run", help="run an experiment matrix (skips runs already stored as ok)")
    parser.add_argument("spec", help="the experiment spec (TOML), e.g. specs/needle_k_sweep.toml")
    parser.add_argument("--devices", type=device_list, action="extend",
                        help="device names or classes, comma-separated (default: the spec's)")
    parser.add_argument("--inventory", help="inventory TOML (default: $BENCHFARM_INVENTORY, "
                        "else the local farm's if it is up, else only `local`)")
    parser.add_argument("--ray-address", help="join this Ray cluster instead of starting one")
    parser.add_argument("--force", action="store_true", help="redo runs already stored as ok")
    parser.add_argument("--lease-ttl", type=positive_seconds,
                        help="board lease time in seconds (default: $BENCHFARM_LEASE_TTL_S "
                             "or 30)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every run of the matrix is stored (ok or failed), 1 when some are pending."""
    spec = load_spec(args.spec)
    inventory = load_inventory(args.inventory)
    with Store.open(args.db) as store:
        summary = run_experiment(spec, inventory, store, args.devices, args.force,
                                 args.ray_address,
                                 coordinator=Coordinator(ttl_s=lease_ttl(args.lease_ttl)))
    print(summary.line())
    return 0 if summary.complete else 1
