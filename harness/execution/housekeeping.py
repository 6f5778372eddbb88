"""`benchfarm gc`: old artifacts out of the board caches and this machine's node cache.

Nothing a queued or running job needs goes: a board that a queued or running job's
placements name, or whose lease is held, is left alone, and so is the node cache while any
job runs. Elsewhere a tree older than ``older_than_s`` goes, and a blob that is older and that
no remaining tree links to (devices.gc).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from db.jobs import ACTIVE
from db.store import Store
from devices.connect import connect
from devices.gc import Collected, collect_board, collect_folder
from devices.inventory import Device, Inventory
from harness.execution.artifacts import default_cache_root
from harness.execution.serving import job_boards


@dataclass
class Housekeeping:
    collected: list[Collected] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # board or cache -> why

    @property
    def bytes(self) -> int:
        return sum(c.bytes for c in self.collected)


def in_use(store: Store, inventory: Inventory) -> dict[str, str]:
    """The boards a queued or running job may use, or that are leased, with the reason."""
    used = {lease.board: f"leased by {lease.holder}" for lease in store.leases.active()}
    for job in store.jobs.list(ACTIVE):
        boards = job_boards(job, inventory)
        for name in inventory.devices if boards is None else boards:
            used.setdefault(name, f"job {job.id} ({job.experiment}) is {job.state}")
    return used


def collect(store: Store, inventory: Inventory, boards: list[Device] | None, nodes: bool,
            older_than_s: float, dry_run: bool) -> Housekeeping:
    result = Housekeeping()
    used = in_use(store, inventory)
    for device in boards or []:
        if device.name in used:
            result.skipped[device.name] = used[device.name]
            continue
        with connect(device) as transport:
            result.collected.append(collect_board(transport, older_than_s, dry_run))
    if nodes:
        root = default_cache_root()
        running = store.jobs.list(("running",))
        if running:
            result.skipped[f"node cache {root}"] = (f"job {running[0].id} "
                                                    f"({running[0].experiment}) is running")
        else:
            result.collected.append(collect_folder(root, older_than_s, dry_run))
    return result
