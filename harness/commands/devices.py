"""`benchfarm devices list|check|probe|trust|state|health [--inventory FILE] [NAME...]`.

NAME may be a device name or a class; none means every device in the inventory. The inventory
defaults to $BENCHFARM_INVENTORY, else ./farm-state/inventory.toml when the local farm is up,
else just the device ``local``. `list` shows each board's state (db.boards), the coordinator
holding its lease and its last health check; `check` stores its results (a failed check makes
an online board bad); `state` takes a board out of service or back; `health` shows a board's
checks and state changes. `check` and `state` are recorded under the caller's identity
(harness.access: a user's token once the store has users).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from harness.commands.arguments import MAX_TEXT_CHARS, add_notify, free_text
from harness.commands.context import boards_of, caller_of, store_of
from harness.commands.table import format_table, shown
from harness.errors import InputError

if TYPE_CHECKING:
    from db.store import Store
    from devices.inventory import Device
    from harness.access.caller import Caller

SETTABLE = ("online", "maintenance", "retired")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "devices", help="list, check, fingerprint, trust devices; set and show board states")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("names", nargs="*", metavar="NAME", help="device names or classes")
    common.add_argument("--inventory", type=Path, help="inventory TOML file")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", parents=[common],
                       help="the inventory with each board's state, lease and last health "
                            "check").add_argument("--json", action="store_true")
    check = actions.add_parser("check", parents=[common],
                               help="reachable, arch, workdir, free disk, `lmc info` runs "
                                    "(stored)")
    check.add_argument("--json", action="store_true")
    check.add_argument("--binary", action="append", default=[], metavar="ARCH=PATH",
                       help="use this lmc for ARCH instead of building it")
    add_notify(check, "announce a board that the check makes bad")
    actions.add_parser("probe", parents=[common], help="print device fingerprints (JSON)")
    trust = actions.add_parser("trust", parents=[common],
                               help="show a device's host key fingerprint and record it")
    trust.add_argument("--replace", action="store_true",
                       help="replace a recorded host key that differs")
    trust.add_argument("--expect", metavar="SHA256:...",
                       help="only record the key if it has this fingerprint")
    state = actions.add_parser("state", help="set a board's state: online, maintenance "
                               "(drain: the run in flight finishes) or retired")
    state.add_argument("names", nargs=1, metavar="NAME", help="device name or class")
    state.add_argument("state", choices=SETTABLE)
    state.add_argument("--reason", type=free_text, help="why (shown by `devices list` and "
                       f"`queue`; at most {MAX_TEXT_CHARS} characters)")
    state.add_argument("--inventory", type=Path, help="inventory TOML file")
    actions.add_parser("health", parents=[common],
                       help="a board's health checks and state changes, newest first")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    devices = boards_of(args)
    if args.action == "probe":
        return _probe(devices)
    if args.action == "trust":
        return _trust(devices, args.replace, args.expect)
    if args.action == "list":
        return _list(devices, args)
    with store_of(args) as store:
        if args.action == "check":
            return _check(devices, store, caller_of(store), _given_binaries(args.binary),
                          args.json, args.notify)
        if args.action == "state":
            return _state(devices, store, caller_of(store), args.state, args.reason)
        return _health(devices, store)


def _list(devices: list[Device], args: argparse.Namespace) -> int:
    from db.boards import BoardStatus
    from db.errors import StoreInputError

    names = [d.name for d in devices]
    states = {name: BoardStatus(name, "online", None, None, None, 0) for name in names}
    holders, health, reserved = {}, {}, {}
    try:
        with store_of(args, create=False) as store:
            states = store.boards.states(names)
            holders = {lease.board: lease.holder for lease in store.leases.active()}
            health = store.boards.last_health(names)
            reserved = store.boards.reservations(names)
    except StoreInputError:
        pass  # no store yet: every board is online, unleased, unchecked
    if args.json:
        rows = [{"name": d.name, "class": d.cls, "arch": d.arch, "address": d.address,
                 "cpus": d.cpus, "threads": d.threads, "emulated": d.emulated,
                 "exec_prefix": d.exec_prefix, "workdir": d.workdir,
                 "state": states[d.name].state, "reason": states[d.name].reason,
                 "since": states[d.name].since and f"{states[d.name].since:%Y-%m-%dT%H:%M:%S}",
                 "lease_holder": holders.get(d.name),
                 "reserved_by": reserved[d.name].owner if d.name in reserved else None,
                 "health": health[d.name].summary if d.name in health else None}
                for d in devices]
        print(json.dumps(rows, indent=2))
        return 0
    print(format_table(
        ["name", "class", "arch", "address", "emulated", "state", "reason", "since (UTC)",
         "lease holder", "reserved by", "last health check"],
        [[d.name, d.cls, d.arch, d.address, "yes" if d.emulated else "no",
          states[d.name].state, states[d.name].reason,
          f"{states[d.name].since:%Y-%m-%d %H:%M}" if states[d.name].since else None,
          holders.get(d.name),
          f"{reserved[d.name].owner} until {reserved[d.name].ends:%H:%M}"
          if d.name in reserved else None,
          f"{health[d.name].checked_at:%Y-%m-%d %H:%M} {health[d.name].summary}"
          if d.name in health else None] for d in devices]))
    return 0


def _given_binaries(values: list[str]) -> dict[str, Path]:
    from devices.inventory import ARCHES

    given = {}
    for value in values:
        arch, sep, path = value.partition("=")
        if not sep or arch not in ARCHES or not Path(path).is_file():
            raise InputError(f"--binary {value!r}: expected ARCH=PATH with ARCH one of "
                             f"{', '.join(ARCHES)} and PATH an existing file")
        given[arch] = Path(path)
    return given


def _check(devices: list[Device], store: Store, caller: Caller, given: dict[str, Path],
           as_json: bool, notify: list[str] | None) -> int:
    from harness.execution.notify import targets_from
    from harness.lab.health import EngineBinaries, check_and_store

    binaries = EngineBinaries(given)
    reports = []
    for device in devices:
        report = check_and_store(device, binaries, store, f"{caller.name} (devices check)",
                                 targets_from(notify),
                                 caller.event("health-check", f"board {device.name}"))
        reports.append(report)
        if not as_json:
            print(f"{device.name}: {'ok' if report.ok else 'FAILED'}")
            for item in report.items:
                print(f"  {'ok ' if item.ok else 'BAD'} {item.name:<10} {shown(item.detail)}")
    if as_json:
        print(json.dumps([{"device": r.device, "ok": r.ok,
                           "checks": [vars(i) for i in r.items]} for r in reports], indent=2))
    return 0 if all(r.ok for r in reports) else 1


def _state(devices: list[Device], store: Store, caller: Caller, state: str,
           reason: str | None) -> int:
    for device in devices:
        store.boards.set_state(device.name, state, reason, caller.name,
                               caller.event("board-state", f"board {device.name}",
                                            detail=state + (f": {reason}" if reason else "")))
        print(f"{device.name}: {state}" + (f" ({shown(reason)})" if reason else "")
              + ("; the run in flight finishes, no new run starts" if state != "online"
                 else ""))
    return 0


def _health(devices: list[Device], store: Store) -> int:
    for device in devices:
        print(f"{device.name}: {store.boards.states([device.name])[device.name].state}")
        checks = store.boards.health(device.name)
        if checks:
            print(format_table(["checked (UTC)", "by", "result"],
                               [[f"{c.checked_at:%Y-%m-%d %H:%M:%S}", c.checked_by, c.summary]
                                for c in checks]))
        else:
            print("  no health checks stored; `benchfarm devices check NAME` runs one")
        changes = store.boards.history(device.name)
        if changes:
            print(format_table(["changed (UTC)", "by", "state", "reason"],
                               [[f"{c.at:%Y-%m-%d %H:%M:%S}", c.changed_by, c.state, c.reason]
                                for c in reversed(changes)]))
    return 0


def _probe(devices: list[Device]) -> int:
    from devices.connect import connect
    from devices.fingerprint import probe

    snapshots = {}
    for device in devices:
        with connect(device) as transport:
            snapshots[device.name] = probe(transport)
    print(json.dumps(snapshots, indent=2))
    return 0


def _trust(devices: list[Device], replace: bool, expect: str | None) -> int:
    from devices.ssh import key_fingerprint, trust_device

    remote = [d for d in devices if not d.is_local]
    if not remote:
        raise InputError("devices trust: name at least one SSH device (local has no host key)")
    for device in remote:
        key, outcome = trust_device(device, replace=replace, expect=expect)
        print(f"{device.name}: {device.address} {key.get_name()} {key_fingerprint(key)} "
              f"{outcome} in {device.known_hosts}")
    return 0
