"""The local farm's record of the sshd processes it started (``farm.json`` in its state folder),
apart from the farm itself so that the inventory can tell whether the farm is up without
importing it (devices.farm builds on devices.inventory)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from devices import procs
from devices.errors import FarmError

DEFAULT_STATE_DIR = Path("farm-state")


@dataclass
class NodeState:
    name: str
    address: str
    port: int
    pid: int
    start_ticks: int  # kernel start time of the pid: tells our sshd from a recycled pid


def state_file(state_dir: Path) -> Path:
    return state_dir / "farm.json"


def read_state(state_dir: Path) -> dict[str, NodeState]:
    try:
        raw = json.loads(state_file(state_dir).read_text())
        return {name: NodeState(**node) for name, node in raw["nodes"].items()}
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError, TypeError) as exc:
        raise FarmError(f"{state_file(state_dir)}: unreadable farm state ({exc}); "
                        "stop any sshd it started by hand and delete the file") from exc


def write_state(state_dir: Path, nodes: dict[str, NodeState]) -> None:
    tmp = state_file(state_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps({"nodes": {n: asdict(s) for n, s in nodes.items()}}, indent=2))
    tmp.replace(state_file(state_dir))


def is_ours(node: NodeState) -> bool:
    return procs.alive(node.pid) and procs.start_ticks(node.pid) == node.start_ticks


def farm_running(state_dir: Path | str | None = None) -> bool:
    """Whether a node of the farm is up (an sshd it started still runs)."""
    state_dir = Path(state_dir or DEFAULT_STATE_DIR)
    return any(is_ours(node) for node in read_state(state_dir).values())
