"""`benchfarm gc`: old artifacts out of the board caches and the node caches (this machine's,
or with a Ray address every live node's, each by a Ray task pinned to its node).

Nothing a queued or running job needs goes: a board that a queued or running job's
placements name, or whose lease is held, is left alone, and so are the node caches while any
job runs. That is what this store knows; a run of another store is seen on the boards and
nodes themselves (devices.gc): a board whose lock file a command holds, and a node cache a
board runner holds, are left alone too, and each is cleaned holding its lock. Elsewhere a tree
older than ``older_than_s`` goes, and a blob that is older and that no remaining tree links to
(devices.gc). A board that cannot be reached, or a node whose task
fails, is reported and the others are still cleaned.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import ray

from db.jobs import ACTIVE
from db.store import Store
from devices.boardlock import LockHolder
from devices.connect import connect
from devices.errors import DeviceError
from devices.gc import Collected, collect_board, collect_folder
from devices.inventory import Device, Inventory
from harness.errors import BenchfarmError
from harness.execution.artifacts import default_cache_root
from harness.execution.cluster import alive_nodes, on_node, ray_session, task_result
from harness.execution.leases import new_holder
from harness.lab.serving import job_boards


@dataclass
class Housekeeping:
    collected: list[Collected] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # board or cache -> why
    failed: dict[str, str] = field(default_factory=dict)  # board or node -> the error

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


@ray.remote(num_cpus=0)
def _collect_node(ip: str, older_than_s: float, dry_run: bool) -> Collected:
    root = default_cache_root()  # this node's: its own $BENCHFARM_NODE_CACHE or home
    return replace(collect_folder(root, older_than_s, dry_run), where=f"node {ip} cache {root}")


def collect_nodes(address: str, older_than_s: float, dry_run: bool, result: Housekeeping
                  ) -> None:
    """Every live node's cache of the Ray cluster at ``address``, one task on each node; a
    node whose task fails goes to ``result.failed``."""
    with ray_session(address):
        refs = {ip: _collect_node.options(name=f"gc node {ip}", scheduling_strategy=on_node(node)
                                          ).remote(ip, older_than_s, dry_run)
                for node, ip in alive_nodes().items()}
        for ip, ref in refs.items():
            try:
                _add(result, task_result(ref, "its task failed"))
            except BenchfarmError as exc:
                result.failed[f"node {ip}"] = str(exc)


def _add(result: Housekeeping, found: Collected) -> None:
    if found.in_use:
        result.skipped[found.where] = found.in_use
    else:
        result.collected.append(found)


def collect(store: Store, inventory: Inventory, boards: list[Device] | None, nodes: bool,
            older_than_s: float, dry_run: bool, ray_address: str | None = None
            ) -> Housekeeping:
    """``nodes``: this machine's node cache, or with ``ray_address`` every node's of that
    cluster."""
    result = Housekeeping()
    used = in_use(store, inventory)
    holder = LockHolder(new_holder(), store.database.url.render_as_string(hide_password=True),
                        None, "gc")
    for device in boards or []:
        if device.name in used:
            result.skipped[device.name] = used[device.name]
            continue
        try:
            with connect(device) as transport:
                _add(result, collect_board(transport, older_than_s, dry_run, holder))
        except DeviceError as exc:
            result.failed[device.name] = str(exc)
    if nodes:
        where = f"node caches of {ray_address}" if ray_address else \
            f"node cache {default_cache_root()}"
        running = store.jobs.list(("running",))
        if running:
            result.skipped[where] = f"job {running[0].id} ({running[0].experiment}) is running"
        elif ray_address:
            collect_nodes(ray_address, older_than_s, dry_run, result)
        else:
            _add(result, collect_folder(default_cache_root(), older_than_s, dry_run))
    return result
