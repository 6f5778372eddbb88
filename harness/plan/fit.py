"""Whether a spec's model fits each board's memory, decided before anything runs.

lmc keeps its weights resident in the format ``--wq`` names (the embedding table and the norms
in f32; with tied embeddings and f32 weights the one table serves both), and its loader peaks
within a chunk of that (engine/README.md, Eviction). ``resident_bytes`` is that figure computed
from config.json, the same sum as the engine's ``weights_bytes``. A board's memory is what is
known without reaching it: this machine's MemTotal for a board on it (an emulated board runs on
this machine too), or what its newest fingerprint recorded (``mem_total_kb``). A run whose
weights alone exceed its board's memory is refused (exit 2) naming both figures; a board whose
memory is not known yet is not judged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from devices.files import read_json
from devices.inventory import Device
from harness.errors import InputError
from harness.plan.matrix import Placement
from harness.spec import Spec
from harness.workloads.kinds import KINDS

Q8_GROUP = 32  # engine/ops.h: one binary16 scale per 32 int8 values
LMC = "lmc"


class DoesNotFit(InputError):
    """A model whose resident weights exceed a board's memory (exit 2)."""


def _text_config(spec: Spec) -> dict[str, Any]:
    document = read_json(spec.model / "config.json")  # type: ignore[operator]
    return document.get("text_config", document) if isinstance(document, dict) else {}


def _matrix_bytes(rows: int, cols: int, wq: str) -> int:
    if wq == "q8":
        return rows * -(-cols // Q8_GROUP) * (Q8_GROUP + 2)
    return rows * cols * (2 if wq == "bf16" else 4)


def resident_bytes(config: Mapping[str, Any], wq: str) -> int:
    """The bytes of lmc's resident weights for a model of ``config`` at ``--wq wq``."""
    hidden, vocab = int(config["hidden_size"]), int(config["vocab_size"])
    layers, heads = int(config["num_hidden_layers"]), int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads", heads))
    head_dim = int(config.get("head_dim") or hidden // heads)
    inter = int(config["intermediate_size"])
    q, kv = heads * head_dim, kv_heads * head_dim
    per_layer = (_matrix_bytes(q, hidden, wq) + 2 * _matrix_bytes(kv, hidden, wq)
                 + _matrix_bytes(hidden, q, wq) + 2 * _matrix_bytes(inter, hidden, wq)
                 + _matrix_bytes(hidden, inter, wq))
    shared = bool(config.get("tie_word_embeddings")) and wq == "f32"
    embed = 0 if shared else vocab * hidden * 4
    norms = hidden + layers * (2 * hidden + 2 * head_dim)
    return layers * per_layer + _matrix_bytes(vocab, hidden, wq) + embed + norms * 4


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
    """DoesNotFit naming the board, its memory and the weights' bytes for the first lmc
    weight format of the spec that a placement's board cannot hold."""
    if spec.model is None or LMC not in spec.engines:
        return
    if not any(KINDS[workload.kind].uses_model for workload in spec.workloads):
        return
    try:
        config = _text_config(spec)
        needs = {wq: resident_bytes(config, wq) for wq in spec.axes(LMC).wq}
    except (KeyError, TypeError, ValueError, OSError):
        return  # harness.plan.inputs and the engine name what is wrong with config.json
    for placement in placements:
        for name in placement.devices:
            board = devices.get(name)
            memory_kb = None if board is None else board_memory_kb(board, recorded)
            if memory_kb is None:
                continue
            for wq, need in needs.items():
                if need > memory_kb * 1024:
                    raise DoesNotFit(
                        f"{spec.path}: the model {spec.model} needs {need / 1e6:,.1f} MB of "
                        f"resident weights at wq {wq}; board {name!r} has "
                        f"{memory_kb * 1024 / 1e6:,.1f} MB of memory (MemTotal): it cannot run "
                        "there (a smaller weight format, or another board)")

