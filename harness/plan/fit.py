"""Whether a spec's model fits each board's memory, decided before anything runs.

Each engine says how many bytes of the model's weights it keeps resident per weight format
(``EngineAdapter.resident_weights``; lmc's loader peaks within a chunk of that). A board's
memory is what is known without reaching it: this machine's MemTotal for a board on it (an
emulated board runs on this machine too), or what its newest fingerprint recorded
(``mem_total_kb``). A run whose weights alone exceed its board's memory is refused (exit 2)
naming both figures; a board whose memory is not known yet is not judged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from devices.inventory import Device
from harness.engines import ENGINES
from harness.errors import InputError
from harness.plan.matrix import Placement, engines_of
from harness.spec import Spec
from harness.workloads.kinds import KINDS


class DoesNotFit(InputError):
    """A model whose resident weights exceed a board's memory (exit 2)."""


def host_memory_kb() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def board_memory_kb(board: Device, recorded: Mapping[str, Mapping[str, Any]]) -> int | None:
    """A board's memory as far as it is known without reaching it (see the module's text)."""
    if board.is_local or board.emulated:
        return host_memory_kb()
    value = recorded.get(board.name, {}).get("mem_total_kb")
    return int(value) if isinstance(value, int) and value > 0 else None


def check_fit(spec: Spec, placements: Sequence[Placement], devices: Mapping[str, Device],
              recorded: Mapping[str, Mapping[str, Any]]) -> None:
    """DoesNotFit naming the engine, the board, its memory and the weights' bytes for the
    first of the spec's weight formats that a placement's board cannot hold."""
    if spec.model is None or not any(KINDS[w.kind].uses_model for w in spec.workloads):
        return
    needs = {(name, label): need for name in engines_of(spec)
             for label, need in ENGINES[name].resident_weights(spec, spec.axes(name)).items()}
    for placement in placements:
        for board_name in placement.devices:
            board = devices.get(board_name)
            memory_kb = None if board is None else board_memory_kb(board, recorded)
            if memory_kb is None:
                continue
            for (engine, label), need in needs.items():
                if need > memory_kb * 1024:
                    raise DoesNotFit(
                        f"{spec.path}: the model {spec.model} needs {need / 1e6:,.1f} MB of "
                        f"resident weights in {engine} at {label}; board {board_name!r} has "
                        f"{memory_kb * 1024 / 1e6:,.1f} MB of memory (MemTotal): it cannot run "
                        "there (a smaller weight format, or another board)")
