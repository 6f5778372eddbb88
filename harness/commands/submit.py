"""`benchfarm submit SPEC`: queue an experiment for `benchfarm serve`, and return at once.

The spec and its devices are checked now: a device or class the inventory does not have, or a
placement whose boards are all retired, is refused (exit 2); a board in maintenance, bad or
reserved for someone else is named, and the job waits for it. The job is the caller's (the
store's check of who they are: harness.access); ``--owner NAME`` queues it for someone else,
which only an admin may, and is recorded as done by the admin for NAME.
"""

from __future__ import annotations

import argparse

from harness.commands.arguments import (
    INVENTORY_HELP,
    add_devices,
    add_inventory,
    add_notify,
    priority,
)
from harness.commands.context import caller_of, inventory_of, spec_of, store_of


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "submit", help="queue an experiment for `benchfarm serve` (validated now, run later)")
    parser.add_argument("spec", help="the experiment spec (TOML); it is stored as it is now")
    parser.add_argument("--priority", type=priority, default=0,
                        help="higher runs first (default %(default)s; ties: first submitted)")
    parser.add_argument("--owner", metavar="NAME",
                        help="queue it as someone else's (admins only; recorded; default: "
                             "you)")
    add_devices(parser)
    add_inventory(parser, INVENTORY_HELP + "; the devices are checked against it")
    parser.add_argument("--force", action="store_true", help="redo runs already stored as ok")
    add_notify(parser, "announce the job's end here, besides the spec's [notify] (http:// or "
               "https:// URLs only: a job carries no command)", urls_only=True)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from harness.errors import InputError
    from harness.execution.gate import blocked_boards
    from harness.execution.notify import targets_from
    from harness.plan.inputs import check_inputs
    from harness.plan.matrix import resolve_placements

    targets = targets_from(args.notify, commands=False)  # a URL that is no http(s) is exit 2
    spec, inventory = spec_of(args), inventory_of(args)
    placements = resolve_placements(spec, list(inventory.devices.values()), args.devices)
    check_inputs(spec)  # what `serve` will read, read now: a job it cannot read is refused here
    notes = []
    with store_of(args) as store:
        caller = caller_of(store)
        acting_for = caller.as_owner(args.owner)
        owner = acting_for or caller.name
        for placement in placements:
            blocked = blocked_boards(store, placement.devices, owner)
            states = store.boards.states(list(placement.devices))
            if all(states[name].state == "retired" for name in placement.devices):
                raise InputError(f"{'; '.join(blocked.values())}: the job could never run")
            notes += blocked.values()
        job_id = store.jobs.add(spec.name, str(Path(args.spec).resolve()), spec.text,
                                owner=owner, devices=args.devices, force=args.force,
                                priority=args.priority,
                                notify=targets.as_dict(),
                                event=caller.event("submit", acting_for=acting_for,
                                                   detail=f"experiment {spec.name}, priority "
                                                          f"{args.priority}"))
    print(f"queued job {job_id}: experiment {spec.name} (priority {args.priority}, owner "
          f"{owner}); `benchfarm serve` runs it, `benchfarm queue` shows it")
    for note in notes:
        print(f"  note: {note}; the job waits for it")
    return 0
