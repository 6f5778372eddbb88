"""``lmc generate --dump-importance FILE``: the prefill importance lmc recorded and what an
independent recompute of layer 0's needs (engine/README.md, "Prefill importance dump").

A text file: a ``#`` line, then ``shape LAYERS HEADS KV_HEADS HEAD_DIM BLOCK POSITIONS PREFILL``
(``PREFILL`` exact or sparse), one ``importance LAYER v...`` line per layer (one value per
prompt position), ``q POS HEAD x...`` per prompt position and query head (layer 0's post-RoPE
query), ``k POS KV_HEAD x...`` per position and KV head (layer 0's key as the cache holds it)
and, for a sparse prefill, ``blocks POS HEAD N b...`` per position and query head (the blocks it
attended, each over the positions up to its own). Floats are written as ``%.9g``: the float32
values exactly. ``parse_importance_dump`` reads it and checks every count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reports.errors import ReportInputError

PREFILL_MODES = ("exact", "sparse")


@dataclass(frozen=True)
class ImportanceDump:
    """One prefill's importance readout and layer 0's inputs."""

    prefill: str  # "exact" or "sparse"
    block: int
    importance: np.ndarray  # [layers][positions] float32, as lmc recorded it
    q: np.ndarray  # [positions][heads][head_dim] float32, layer 0
    k: np.ndarray  # [positions][kv_heads][head_dim] float32, layer 0
    blocks: list[list[tuple[int, ...]]] | None  # [position][head] -> block ids; None: exact

    @property
    def positions(self) -> int:
        return self.q.shape[0]


def _numbers(fields: list[str], count: int, what: str, dtype: type) -> np.ndarray:
    if len(fields) != count:
        raise ReportInputError(f"{what}: {len(fields)} values, expected {count}")
    try:
        return np.array([dtype(f) for f in fields], dtype=np.float32 if dtype is float else int)
    except ValueError as exc:
        raise ReportInputError(f"{what}: {exc}") from None


def _ints(fields: list[str], what: str) -> tuple[int, ...]:
    try:
        return tuple(int(f) for f in fields)
    except ValueError as exc:
        raise ReportInputError(f"{what}: {exc}") from None


def parse_importance_dump(text: str, name: str = "--dump-importance file") -> ImportanceDump:
    """The dump of ``text`` (``name`` in messages); ReportInputError naming the line that does
    not fit the format."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if not lines or not lines[0].startswith("shape "):
        raise ReportInputError(f"{name}: no 'shape' line first; is it lmc's --dump-importance?")
    shape = lines[0].split()
    if len(shape) != 8 or shape[7] not in PREFILL_MODES:
        raise ReportInputError(f"{name}: bad shape line {lines[0]!r}")
    layers, heads, kv_heads, dim, block, positions = _ints(shape[1:7], f"{name}, shape line")
    importance = np.zeros((layers, positions), dtype=np.float32)
    q = np.zeros((positions, heads, dim), dtype=np.float32)
    k = np.zeros((positions, kv_heads, dim), dtype=np.float32)
    sparse = shape[7] == "sparse"
    blocks: list[list[tuple[int, ...]]] = [[() for _ in range(heads)] for _ in range(positions)]
    seen = {"importance": set(), "q": set(), "k": set(), "blocks": set()}
    limits = {"importance": (layers,), "q": (positions, heads), "k": (positions, kv_heads),
              "blocks": (positions, heads)}
    for number, line in enumerate(lines[1:], start=2):
        label, *fields = line.split()
        where = f"{name}, line {number} ({label})"
        size = 1 if label == "importance" else 2
        if label not in seen or len(fields) < size:
            raise ReportInputError(f"{where}: unknown or short line")
        index = _ints(fields[:size], where)
        if any(not 0 <= i < n for i, n in zip(index, limits[label], strict=True)):
            raise ReportInputError(f"{where}: index {index} outside the shape")
        if index in seen[label]:
            raise ReportInputError(f"{where}: index {index} given twice")
        seen[label].add(index)
        values = fields[size:]
        if label == "importance":
            importance[index] = _numbers(values, positions, where, float)
        elif label == "q":
            q[index] = _numbers(values, dim, where, float)
        elif label == "k":
            k[index] = _numbers(values, dim, where, float)
        else:
            ids = _numbers(values, _ints(values[:1], where)[0] + 1 if values else 0, where, int)[1:]
            blocks[index[0]][index[1]] = tuple(int(b) for b in ids)
    wanted = {"importance": layers, "q": positions * heads, "k": positions * kv_heads,
              "blocks": positions * heads if sparse else 0}
    for label, count in wanted.items():
        if len(seen[label]) != count:
            raise ReportInputError(f"{name}: {len(seen[label])} '{label}' lines, expected "
                                   f"{count} (shape {' '.join(shape[1:])})")
    return ImportanceDump(prefill=shape[7], block=block, importance=importance, q=q, k=k,
                          blocks=blocks if sparse else None)
