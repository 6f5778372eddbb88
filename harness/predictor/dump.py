"""Key-feature dumps written by ``lmc ppl --dump-features FILE`` (format: engine/keyfeat.h).

A dump holds two text lines — ``lmc-keyfeat 1 <columns> <heads>`` and the column names — then
float32 rows: the query position, the layer, the key position, the features, the target (the
attention mass the key got at that layer, mean over query heads).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.engines.lmc import run_here
from harness.errors import InputError


@dataclass
class KeyDump:
    """The rows of one or more dumps; ``text`` tells which text (dump) a row came from."""

    names: list[str]
    rows: np.ndarray  # float32 [n, len(names)]
    text: np.ndarray  # int32 [n]

    def column(self, name: str) -> np.ndarray:
        return self.rows[:, self.names.index(name)]

    @property
    def features(self) -> list[str]:
        return self.names[3:-1]

    def select(self, mask: np.ndarray) -> KeyDump:
        return KeyDump(self.names, self.rows[mask], self.text[mask])


def read_dump(path: Path, text: int = 0) -> KeyDump:
    """Read one dump file; ``text`` labels its rows."""
    raw = Path(path).read_bytes()
    try:
        first = raw.index(b"\n")
        second = raw.index(b"\n", first + 1)
        magic, version, cols, _heads = raw[:first].decode().split()
        names = raw[first + 1:second].decode().split()
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not an lmc key-feature dump (no header lines)") from exc
    if magic != "lmc-keyfeat" or version != "1" or int(cols) != len(names):
        raise InputError(f"{path}: not an lmc-keyfeat 1 dump (header {raw[:first]!r})")
    body = raw[second + 1:]
    if len(body) % (4 * len(names)):
        raise InputError(f"{path}: {len(body)} bytes of rows, not whole rows of {len(names)} f32")
    rows = np.frombuffer(body, dtype="<f4").reshape(-1, len(names)).copy()
    return KeyDump(names, rows, np.full(len(rows), text, dtype=np.int32))


def concat(dumps: Sequence[KeyDump]) -> KeyDump:
    if any(d.names != dumps[0].names for d in dumps):
        raise InputError("key-feature dumps with different columns cannot be combined")
    return KeyDump(dumps[0].names, np.concatenate([d.rows for d in dumps]),
                   np.concatenate([d.text for d in dumps]))


def run_dump(lmc: Sequence[str], model: Path, ids: Sequence[int], every: int, text: int,
             timeout: float = 900) -> KeyDump:
    """Run ``lmc ppl`` over ``ids`` with exact attention and read back its key features (every
    ``every``-th query position)."""
    with tempfile.TemporaryDirectory(prefix="benchfarm-keyfeat-") as tmp:
        out = Path(tmp) / "keys.bin"
        # the run's own document is checked too: a whole one, or RunFailure
        run_here(lmc, "ppl", model, ids, ["--dump-features", str(out), "--dump-every",
                                          str(every)], timeout)
        return read_dump(out, text)
