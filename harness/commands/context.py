"""What the commands open from their arguments, each written once: the store ``--db`` names
(and who the caller is to it), the inventory ``--inventory`` names (and the boards a command's
NAMEs select from it), the spec its SPEC names, and the measurer ``bisect`` and ``track`` step
through revisions with.

Light to import, as every command module is (``register()`` runs with argparse-level modules
only: tests/project/test_cli_startup.py): each helper imports what it opens when it is called.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from db.store import Store
    from devices.inventory import Device, Inventory
    from harness.access.caller import Caller
    from harness.history.measure import Measurer
    from harness.spec import Spec


def store_of(args: argparse.Namespace, create: bool = True, read_only: bool = False) -> Store:
    """The store ``--db`` names, its schema brought up to date (a context manager that closes
    it). ``create=False`` for a command that only reads it: a store that does not exist yet
    is a StoreInputError, not a new empty one. ``read_only`` for a command that never writes:
    its reads go on while a coordinator writes (Store)."""
    from db.store import Store

    return Store.open(args.db, create=create, read_only=read_only)


def caller_of(store: Store) -> Caller:
    """Who runs this command, as ``store`` knows them: the local user while it has no users,
    else the user whose token the token file holds (IdentityError, exit 2, when none)."""
    from harness.access.caller import resolve_caller

    return resolve_caller(store)


def inventory_of(args: argparse.Namespace) -> Inventory:
    """The inventory ``--inventory`` names (default: devices.inventory's)."""
    from devices.inventory import load_inventory

    return load_inventory(args.inventory)


def boards_of(args: argparse.Namespace) -> list[Device]:
    """The inventory's devices the command's NAMEs select, by name or class (none: all)."""
    return inventory_of(args).select(args.names)


def spec_of(args: argparse.Namespace) -> Spec:
    """The spec the command's SPEC names, validated."""
    from harness.spec import load_spec

    return load_spec(args.spec)


@contextmanager
def measuring(args: argparse.Namespace, spec: Spec, inventory: Inventory) -> Iterator[Measurer]:
    """``bisect``, ``track``: a measurer of ``spec`` at any revision, on ``--device`` (default:
    the spec's first), in the store, on Ray (``--ray-address`` or a local instance)."""
    from harness.history.measure import Measurer

    with store_of(args) as store, \
            Measurer(spec, inventory, store, args.device or spec.devices[0],
                     args.ray_address, caller=caller_of(store)) as measurer:
        yield measurer
