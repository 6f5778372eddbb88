"""The device inventory: which boards exist, how to reach them and how to run on them.

An inventory is a TOML file with one ``[[device]]`` table per node. Everything is validated on
load; an error names the file, the device and the key. The device ``local`` (this machine,
reached without SSH) always exists; an inventory may tune it (cpus, threads, workdir, ...) but
not give it an address. More boards on this machine are declared with ``transport = "local"``:
each has a name, a workdir (its cache and its lock file, so no two boards of this machine share
one) and cpus of its own, and, like ``local``, no address and no SSH keys.
"""

from __future__ import annotations

import getpass
import json
import math
import os
import re
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devices.checker import Checker
from devices.errors import InventoryError
from devices.farm_state import DEFAULT_STATE_DIR, farm_running
from devices.files import loads_toml, read_text
from devices.isa import BY_NAME

LOCAL = "local"
ARCHES = ("x86_64", "aarch64")
TRANSPORTS = ("ssh", "local")
NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]*\Z")


def default_local_workdir(name: str = LOCAL) -> str:
    """The workdir of a board on this machine: ``$BENCHFARM_LOCAL_WORKDIR`` for ``local``, else
    ``~/.cache/benchfarm/<name>`` (``$XDG_CACHE_HOME`` if set)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    own = os.environ.get("BENCHFARM_LOCAL_WORKDIR") if name == LOCAL else None
    return own or str(Path(base) / "benchfarm" / name)


@dataclass
class Device:
    """One node of the farm. ``cls`` is the TOML key ``class`` (e.g. ``rk3588``)."""

    name: str
    arch: str
    cls: str
    host: str | None = None  # None only for a board on this machine (transport "local")
    port: int = 22
    user: str = field(default_factory=getpass.getuser)
    key: Path | None = None  # private key file; None: ~/.ssh default keys
    cpus: list[int] | None = None  # cores to pin runs to (taskset -c)
    threads: int | None = None  # engine threads to use; default: len(cpus)
    workdir: str = "/var/tmp/benchfarm"
    exec_prefix: list[str] = field(default_factory=list)  # e.g. an emulator
    emulated: bool = False
    insecure_accept_new: bool = False  # accept (and record) an unknown host key
    known_hosts: Path = field(default_factory=lambda: Path.home() / ".ssh" / "known_hosts")
    resources: dict[str, float] = field(default_factory=dict)  # Ray custom resources
    connect_timeout: float = 10.0
    connect_retries: int = 3
    keepalive_s: int = 15
    source: Path | None = None  # the inventory file it came from
    transport: str = "ssh"  # "local": this machine, commands are plain subprocesses
    isa: str | None = None  # the instruction-set level pinned (devices.isa); None: the highest

    @property
    def is_local(self) -> bool:
        """On this machine, reached without SSH (``local``, or ``transport = "local"``)."""
        return self.transport == "local"

    @property
    def address(self) -> str:
        return LOCAL if self.is_local else f"{self.user}@{self.host}:{self.port}"

    @property
    def engine_threads(self) -> int:
        if self.threads:
            return self.threads
        return len(self.cpus) if self.cpus else 1


def local_device() -> Device:
    return Device(name=LOCAL, arch=os.uname().machine, cls=LOCAL, workdir=default_local_workdir(),
                  transport="local")


# ---------------------------------------------------------------------------------------------
# Validation: one converter per key, each returns the converted value or raises ValueError with
# a description of what is allowed (Checker.converted names the file, the device and the key).
# ---------------------------------------------------------------------------------------------


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("a non-empty string")
    return value


def _name(value: Any) -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise ValueError("a name matching [a-z0-9][a-z0-9._-]*")
    return value


def _user(value: Any) -> str:
    if not isinstance(value, str) or not re.match(r"[A-Za-z0-9_][A-Za-z0-9._-]*\Z", value):
        raise ValueError("a user name (letters, digits, '.', '_', '-')")
    return value


def _host(value: Any) -> str:
    text = _string(value)
    if not re.match(r"[A-Za-z0-9._:-]+\Z", text) or text.startswith("-"):
        raise ValueError("a host name or IP address (letters, digits, '.', '-', ':')")
    return text


def _arch(value: Any) -> str:
    if value not in ARCHES:
        raise ValueError(f"one of {', '.join(ARCHES)}")
    return value


def _int_in(low: int, high: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"an integer from {low} to {high}")
        return value

    return check


def _positive_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError("a positive number")
    if not math.isfinite(value):
        raise ValueError("a finite positive number")
    return float(value)


def _transport(value: Any) -> str:
    if value not in TRANSPORTS:
        raise ValueError(f"one of {', '.join(map(repr, TRANSPORTS))}")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("true or false")
    return value


def _cpus(value: Any) -> list[int]:
    if not isinstance(value, list) or not value:
        raise ValueError("a non-empty list of CPU numbers, e.g. [4, 5, 6, 7]")
    for cpu in value:
        if isinstance(cpu, bool) or not isinstance(cpu, int) or not 0 <= cpu < 4096:
            raise ValueError("a list of CPU numbers from 0 to 4095")
    if len(set(value)) != len(value):
        raise ValueError("a list of distinct CPU numbers")
    return list(value)


def _argv(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
        raise ValueError('a list of non-empty strings, e.g. ["qemu-aarch64-static"]')
    return list(value)


def _absolute_posix_path(value: Any) -> str:
    text = _string(value)
    if not text.startswith("/") or "\n" in text or "\0" in text:
        raise ValueError("an absolute path on the device")
    return text.rstrip("/") or "/"


# Resources Ray declares for every node; a board may only ask for custom ones.
RAY_RESOURCES = ("CPU", "GPU", "TPU", "memory", "object_store_memory")
RAY_RESOURCE_PREFIXES = ("node:", "accelerator_type:")


def _isa_name(value: Any) -> str:
    name = _string(value)
    if name not in BY_NAME:
        raise ValueError(f"an instruction-set level; allowed: {', '.join(BY_NAME)}")
    return name


def _resources(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        raise ValueError('a table of resource name = amount, e.g. {gateway-a = 1}')
    out = {}
    for key, amount in value.items():
        if key in RAY_RESOURCES or key.startswith(RAY_RESOURCE_PREFIXES):
            raise ValueError(f"a table of custom resources; {key!r} is one Ray defines itself "
                             f"(reserved: {', '.join(RAY_RESOURCES)}, "
                             f"{', '.join(p + '*' for p in RAY_RESOURCE_PREFIXES)})")
        out[key] = _positive_float(amount)
    return out


# Path-valued keys are resolved relative to the inventory file; see _local_path.
KEYS: dict[str, Callable[[Any], Any]] = {
    "name": _name,
    "host": _host,
    "port": _int_in(1, 65535),
    "user": _user,
    "key": _string,
    "arch": _arch,
    "class": _name,
    "cpus": _cpus,
    "threads": _int_in(1, 1024),
    "workdir": _absolute_posix_path,
    "exec_prefix": _argv,
    "emulated": _bool,
    "insecure_accept_new": _bool,
    "known_hosts": _string,
    "resources": _resources,
    "connect_timeout": _positive_float,
    "connect_retries": _int_in(1, 20),
    "keepalive_s": _int_in(0, 3600),
    "transport": _transport,
    "isa": _isa_name,
}
REQUIRED = ("name", "host", "arch")
SSH_ONLY = ("host", "port", "user", "key", "insecure_accept_new", "known_hosts",
            "connect_timeout", "connect_retries", "keepalive_s")
PATH_KEYS = ("key", "known_hosts")


@dataclass
class Inventory:
    devices: dict[str, Device]
    source: Path | None = None

    def names(self) -> list[str]:
        return list(self.devices)

    def get(self, name: str) -> Device:
        try:
            return self.devices[name]
        except KeyError:
            raise InventoryError(
                f"{self._where()}: no device named {name!r}; known: {', '.join(self.devices)}"
            ) from None

    def select(self, names_or_classes: Iterable[str]) -> list[Device]:
        """Devices matching each item by name or class, in order, without repeats.

        An empty selection means every device.
        """
        wanted = list(names_or_classes)
        if not wanted:
            return list(self.devices.values())
        chosen: dict[str, Device] = {}
        for item in wanted:
            matches = [d for d in self.devices.values() if item in (d.name, d.cls)]
            if not matches:
                classes = sorted({d.cls for d in self.devices.values()})
                raise InventoryError(
                    f"{self._where()}: no device or class named {item!r}; devices: "
                    f"{', '.join(self.devices)}; classes: {', '.join(classes)}"
                )
            for device in matches:
                chosen.setdefault(device.name, device)
        return list(chosen.values())

    def _where(self) -> str:
        return str(self.source) if self.source else "inventory (built-in: local only)"


def default_inventory_path() -> Path | None:
    """$BENCHFARM_INVENTORY, else the local farm's inventory while the farm is up (after
    `benchfarm farm down` its boards are unreachable: no command should try them)."""
    env = os.environ.get("BENCHFARM_INVENTORY")
    if env:
        return Path(env)
    farm = DEFAULT_STATE_DIR / "inventory.toml"
    if not farm.is_file():
        return None
    return farm if farm_running(DEFAULT_STATE_DIR) else None


def device_table(fields: dict[str, Any]) -> str:
    """One ``[[device]]`` table of an inventory file, keys in the given order. The values are
    strings, numbers, booleans or lists of them, whose JSON spelling is also valid TOML."""
    return "\n[[device]]\n" + "".join(f"{key} = {json.dumps(value)}\n"
                                        for key, value in fields.items())


def load_inventory(path: Path | str | None = None) -> Inventory:
    """Load and validate an inventory; ``None`` means `default_inventory_path()`."""
    path = Path(path) if path is not None else default_inventory_path()
    devices = {LOCAL: local_device()}
    if path is None:
        return Inventory(devices)
    try:
        document = loads_toml(read_text(path))
    except OSError as exc:
        raise InventoryError(f"{path}: cannot read inventory: {exc.strerror or exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InventoryError(f"{path}: not valid TOML: {exc}") from exc

    unknown = sorted(set(document) - {"device"})
    if unknown:
        raise InventoryError(f"{path}: unknown top-level key {unknown[0]!r}; allowed: [[device]]")
    tables = document.get("device", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise InventoryError(f"{path}: key 'device' must be an array of tables ([[device]])")

    seen_local = False
    for index, table in enumerate(tables, start=1):
        device = _parse_device(path, index, table)
        if device.name in devices and (device.name != LOCAL or seen_local):
            raise _checker(path, f"device {device.name!r}").fail("name", "duplicate name")
        seen_local = seen_local or device.name == LOCAL
        devices[device.name] = device
    _check_own_workdirs(path, devices)
    return Inventory(devices, source=path)


def _checker(path: Path, device: str) -> Checker:
    """The checks of one ``[[device]]`` table; its messages write keys as Python does."""
    return Checker(path, InventoryError, "inventory", device, quote=repr)


def _check_own_workdirs(path: Path, devices: dict[str, Device]) -> None:
    """Boards on this machine each need a workdir of their own: it holds the board's lock file
    (devices.boardlock), and two boards sharing one would take turns instead of running side by
    side."""
    owner: dict[str, str] = {}
    for device in devices.values():
        if not device.is_local:
            continue
        workdir = os.path.normpath(device.workdir)
        if workdir in owner:
            raise _checker(path, f"device {device.name!r}").fail(
                "workdir", f"{device.workdir} is also the workdir of device {owner[workdir]!r}; "
                "boards on this machine each need their own (it holds the board's lock file)")
        owner[workdir] = device.name


def _parse_device(path: Path, index: int, table: dict[str, Any]) -> Device:
    label = f"device #{index}"
    if isinstance(table.get("name"), str) and NAME_RE.match(table["name"]):
        label = f"device {table['name']!r}"
    check = _checker(path, label)
    values: dict[str, Any] = {}
    for key, raw in table.items():
        convert = KEYS.get(key)
        if convert is None:  # the first unknown key as written, the allowed ones in KEYS' order
            raise check.fail(key, f"unknown key; allowed: {', '.join(KEYS)}")
        values[key] = check.converted(raw, key, convert)

    named_local = values.get("name") == LOCAL
    transport = values.get("transport", "local" if named_local else "ssh")
    if named_local and transport != "local":
        raise check.fail("transport",
                         "the device `local` is this machine: its transport is 'local'")
    is_local = transport == "local"
    required = ("name",) if is_local else REQUIRED
    for key in required:
        if key not in values:
            raise check.fail(key, "missing (required)")
    if is_local:
        for key in (*SSH_ONLY, "arch"):
            if key in values:
                raise check.fail(key, "not allowed for the local device (it is this machine)"
                                 if named_local else "not allowed with transport = 'local' (the "
                                 "board is this machine, reached without SSH)")
    if "threads" in values and "cpus" in values and values["threads"] > len(values["cpus"]):
        raise check.fail("threads", f"{values['threads']} threads exceed the "
                                    f"{len(values['cpus'])} pinned cpus")

    if "isa" in values and BY_NAME[values["isa"]].arch != values.get("arch", os.uname().machine):
        raise check.fail("isa", f"{values['isa']!r} is a level of {BY_NAME[values['isa']].arch}, "
                                "not of the device's arch")
    if named_local:
        device = local_device()
    elif is_local:
        arch = os.uname().machine
        device = Device(name=values["name"], arch=arch, cls=arch, transport="local",
                        workdir=default_local_workdir(values["name"]))
    else:
        device = Device(name=values["name"], arch=values["arch"], cls=values["arch"])
    for key, value in values.items():
        if key in PATH_KEYS:
            value = _local_path(path, value)
        setattr(device, "cls" if key == "class" else key, value)
    device.source = path
    return device


def _local_path(inventory: Path, value: str) -> Path:
    """A path on this machine: ``~`` expanded, relative paths taken from the inventory's folder."""
    expanded = Path(value).expanduser()
    return expanded if expanded.is_absolute() else (inventory.parent / expanded).resolve()
