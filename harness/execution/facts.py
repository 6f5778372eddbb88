"""What the coordinator knows of its boards before it plans: each board's newest stored
fingerprint (its CPU features and memory), and for a board never fingerprinted, its CPU
features read now (one short command), so that its first experiment is planned for the
instruction-set level it keeps (devices.isa): otherwise its first runs would be keyed for the
fallback level and a rerun, knowing better, would redo them all. A board that cannot be reached
now keeps the fallback level; the runner checks its features before it starts a binary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from db.store import Store
from devices.connect import connect
from devices.errors import DeviceError
from devices.inventory import Inventory
from devices.isa import board_features
from harness.plan.matrix import resolve_placements
from harness.spec import Spec


def board_facts(store: Store, spec: Spec, inventory: Inventory,
                selectors: Sequence[str] | None) -> dict[str, dict[str, Any]]:
    """{board: {"cpu_features", "mem_total_kb"}} for the boards the spec runs on."""
    boards = list(inventory.devices.values())
    facts = store.boards.newest_facts([d.name for d in boards])
    names = {name for p in resolve_placements(spec, boards, selectors, facts)
             for name in p.devices}
    for name in sorted(names):
        device = inventory.devices[name]
        if device.is_local or device.emulated or facts.get(name, {}).get("cpu_features"):
            continue  # known without asking: this machine's, its emulator's, or recorded
        try:
            with connect(device) as transport:
                features = board_features(device, transport)
        except (DeviceError, OSError):  # unreachable now: the fallback level, checked at run time
            continue
        facts.setdefault(name, {})["cpu_features"] = sorted(features)
    return facts
