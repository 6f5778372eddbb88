"""`benchfarm run SPEC`: run an experiment matrix on the farm; resumable.

``--dry-run`` runs nothing and writes nothing: it prints the matrix's size per placement and an
estimated time from the durations of stored runs (harness.plan.estimate).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from harness.commands.arguments import (
    INVENTORY_HELP,
    add_devices,
    add_inventory,
    add_lease_ttl,
    add_notify,
    add_ray_address,
    run_count,
)
from harness.commands.context import caller_of, inventory_of, spec_of, store_of
from harness.plan import MAX_RUNS

if TYPE_CHECKING:
    from db.store import Store
    from devices.inventory import Inventory
    from harness.plan.matrix import Cell, Placement
    from harness.spec import Spec


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run", help="run an experiment matrix (skips runs already stored as ok)")
    parser.add_argument("spec", help="the experiment spec (TOML), e.g. specs/needle_k_sweep.toml")
    add_devices(parser)
    add_inventory(parser, INVENTORY_HELP)
    add_ray_address(parser)
    parser.add_argument("--force", action="store_true", help="redo runs already stored as ok")
    parser.add_argument("--max-runs", type=run_count, default=MAX_RUNS,
                        help="refuse a matrix of more runs than this (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true",
                        help="run nothing: print the matrix's size and an estimated time from "
                        "stored durations")
    add_lease_ttl(parser)
    add_notify(parser, "announce the job's end here, besides the spec's [notify]")
    parser.add_argument("--bad-after", type=run_count,
                        help="runs lost in a row that make a board bad (default: "
                             "$BENCHFARM_BAD_AFTER or 3)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every run of the matrix is stored (ok or failed) and not every one failed;
    1 when some are pending or all failed."""
    from harness.execution.coordinator import Coordinator, RunRequest, run_experiment
    from harness.execution.leases import lease_ttl
    from harness.execution.notify import targets_from

    spec, inventory = spec_of(args), inventory_of(args)
    if args.dry_run:
        return dry_run(args, spec, inventory)
    with store_of(args) as store:
        summary = run_experiment(RunRequest(
            spec, inventory, args.devices, args.force, args.ray_address, max_runs=args.max_runs,
            coordinator=Coordinator(ttl_s=lease_ttl(args.lease_ttl)),
            notify=targets_from(args.notify), bad_after=args.bad_after,
            caller=caller_of(store)), store)
    print(f"job {summary.job_id}: {summary.line()}")
    return 0 if summary.succeeded else 1


def dry_run(args: argparse.Namespace, spec: Spec, inventory: Inventory) -> int:
    from db.errors import StoreInputError
    from db.queries import RunDuration
    from harness.plan.estimate import estimate
    from harness.plan.fit import check_fit
    from harness.plan.inputs import check_inputs
    from harness.plan.matrix import check_size, count_cells, resolve_placements

    boards = list(inventory.devices.values())
    recorded: dict[str, dict] = {}  # what the store's newest fingerprints recorded
    try:
        with store_of(args, create=False) as store:
            recorded = store.boards.newest_facts([d.name for d in boards])
    except StoreInputError:
        pass  # no store yet: the levels of boards never fingerprinted (said below)
    placements = resolve_placements(spec, boards, args.devices, recorded)
    check_inputs(spec)  # an unreadable model, tokenizer or template: one line, exit 2
    check_fit(spec, placements, inventory.devices, recorded)  # weights beyond a board's memory
    total = sum(count_cells(spec, placements).values())
    print(f"experiment {spec.name}: {total} runs in the matrix (limit {args.max_runs}, "
          "--max-runs)")
    check_size(spec, placements, args.max_runs)
    durations: list[RunDuration] = []
    done: set[Cell] = set()
    try:
        with store_of(args, create=False) as store:
            durations = store.run_durations()
            done = stored_ok_cells(store, spec, inventory, placements)
    except StoreInputError as exc:
        print(f"  no stored durations to go by ({exc})")
    for line in estimate(spec, placements, durations, done).lines():
        print(line)
    return 0


def stored_ok_cells(store: Store, spec: Spec, inventory: Inventory,
                    placements: list[Placement]) -> set[Cell]:
    """The matrix's cells already stored as ok (a run would skip them), named by their run keys
    without building anything; an empty set, with the reason printed, when they cannot be."""
    from harness.engines.base import NeedsBuild
    from harness.errors import InputError
    from harness.plan.planner import identities, make_plan

    try:
        plan = make_plan(spec, placements, inventory.devices, identities(spec, placements))
    except NeedsBuild as exc:
        why = f"{exc.engine}'s run keys need its build"
    except InputError as exc:
        why = str(exc)
    else:
        done = store.completed_run_keys([r.key for r in plan.runs])
        return {r.cell for r in plan.runs if r.key in done}
    print(f"  runs already stored as ok are counted as to run: {why}")
    return set()
