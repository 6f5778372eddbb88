"""`benchfarm farm up|status|down`: the local farm of sshd nodes (see devices.farm)."""

from __future__ import annotations

import argparse
from pathlib import Path

from devices.inventory import DEFAULT_STATE_DIR


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("farm", help="start, inspect or stop the local sshd farm")
    parser.add_argument("action", choices=("up", "status", "down"))
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE_DIR,
                        help="state directory: keys, sshd configs, logs, inventory.toml "
                             "(default: %(default)s)")
    parser.set_defaults(func=run)


def _print_status(state: Path) -> bool:
    from devices.farm import farm_status

    nodes = farm_status(state)
    for node in nodes:
        where = f"{node.address}:{node.port}" if node.port else node.address
        state_text = f"running (pid {node.pid})" if node.running else "stopped"
        print(f"{node.name:<10} {where:<22} {state_text}")
    return all(node.running for node in nodes)


def run(args: argparse.Namespace) -> int:
    from devices.farm import farm_down, farm_up
    from devices.inventory import default_inventory_path

    if args.action == "up":
        inventory = farm_up(args.state)
        _print_status(args.state)
        print(f"inventory: {inventory}")
        return 0
    if args.action == "status":
        # Exit 1 when a node is down, so scripts can wait for or react to it.
        return 0 if _print_status(args.state) else 1
    stopped = farm_down(args.state)
    print(f"stopped {len(stopped)} processes" + (f": {' '.join(map(str, stopped))}"
                                                 if stopped else ""))
    if args.state.resolve() == DEFAULT_STATE_DIR.resolve() and default_inventory_path() is None:
        print("the default inventory is the built-in one (local only) until `benchfarm farm up`")
    return 0
