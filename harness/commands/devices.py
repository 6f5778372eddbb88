"""`benchfarm devices list|check|probe|trust [--inventory FILE] [NAME...]`.

NAME may be a device name or a class; none means every device in the inventory. The inventory
defaults to $BENCHFARM_INVENTORY, else ./farm-state/inventory.toml when the local farm is up,
else just the device ``local``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from devices.connect import connect
from devices.fingerprint import probe
from devices.health import check_device
from devices.inventory import Device, load_inventory
from harness.engines import engine_check, get_engine
from harness.engines.lmc import NAME as LMC
from harness.engines.lmc.build import TARGETS
from harness.errors import InputError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("devices", help="list, check, fingerprint or trust devices")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("names", nargs="*", metavar="NAME", help="device names or classes")
    common.add_argument("--inventory", type=Path, help="inventory TOML file")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", parents=[common], help="show the inventory").add_argument(
        "--json", action="store_true")
    check = actions.add_parser("check", parents=[common],
                               help="reachable, arch, workdir, free disk, `lmc info` runs")
    check.add_argument("--json", action="store_true")
    check.add_argument("--binary", action="append", default=[], metavar="ARCH=PATH",
                       help="use this lmc for ARCH instead of building it")
    actions.add_parser("probe", parents=[common], help="print device fingerprints (JSON)")
    trust = actions.add_parser("trust", parents=[common],
                               help="show a device's host key fingerprint and record it")
    trust.add_argument("--replace", action="store_true",
                       help="replace a recorded host key that differs")
    trust.add_argument("--expect", metavar="SHA256:...",
                       help="only record the key if it has this fingerprint")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    inventory = load_inventory(args.inventory)
    devices = inventory.select(args.names)
    if args.action == "list":
        return _list(devices, args.json)
    if args.action == "check":
        return _check(devices, _given_binaries(args.binary), args.json)
    if args.action == "probe":
        return _probe(devices)
    return _trust(devices, args.replace, args.expect)


def _list(devices: list[Device], as_json: bool) -> int:
    if as_json:
        rows = [{"name": d.name, "class": d.cls, "arch": d.arch, "address": d.address,
                 "cpus": d.cpus, "threads": d.threads, "emulated": d.emulated,
                 "exec_prefix": d.exec_prefix, "workdir": d.workdir} for d in devices]
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'NAME':<14} {'CLASS':<10} {'ARCH':<8} {'ADDRESS':<28} {'CPUS':<16} EMULATED")
    for d in devices:
        cpus = ",".join(map(str, d.cpus)) if d.cpus else "-"
        print(f"{d.name:<14} {d.cls:<10} {d.arch:<8} {d.address:<28} {cpus:<16} "
              f"{'yes' if d.emulated else 'no'}")
    return 0


def _given_binaries(values: list[str]) -> dict[str, Path]:
    given = {}
    for value in values:
        arch, sep, path = value.partition("=")
        if not sep or arch not in TARGETS or not Path(path).is_file():
            raise InputError(f"--binary {value!r}: expected ARCH=PATH with ARCH one of "
                             f"{', '.join(TARGETS)} and PATH an existing file")
        given[arch] = Path(path)
    return given


def _engine_for(arch: str, given: dict[str, Path],
                cache: dict[str, tuple[Path | None, str | None]]) -> tuple[Path | None, str | None]:
    if arch in given:
        return given[arch], None
    if arch not in cache:
        try:
            cache[arch] = (Path(get_engine(LMC).build(arch, None).binary), None)
        except Exception as exc:  # noqa: BLE001 - any build failure becomes a failed check
            if getattr(type(exc), "exit_code", None) is None:
                raise
            cache[arch] = (None, f"building lmc for {arch} failed: {exc}")
    return cache[arch]


def _check(devices: list[Device], given: dict[str, Path], as_json: bool) -> int:
    built: dict[str, tuple[Path | None, str | None]] = {}
    reports = []
    for device in devices:
        binary, problem = _engine_for(device.arch, given, built)
        report = check_device(device, engine_check(LMC, binary, problem))
        reports.append(report)
        if not as_json:
            print(f"{device.name}: {'ok' if report.ok else 'FAILED'}")
            for item in report.items:
                print(f"  {'ok ' if item.ok else 'BAD'} {item.name:<10} {item.detail}")
    if as_json:
        print(json.dumps([{"device": r.device, "ok": r.ok,
                           "checks": [vars(i) for i in r.items]} for r in reports], indent=2))
    return 0 if all(r.ok for r in reports) else 1


def _probe(devices: list[Device]) -> int:
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

