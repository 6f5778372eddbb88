"""Reading and writing safetensors files byte by byte (any dtype, BF16 included), for tests
that build or break checkpoints; sharding is bench/shard_model.py's."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import shard_model  # noqa: E402


def shard_checkpoint(model_dir: Path, n_shards: int) -> dict:
    """Replace model_dir/model.safetensors by n_shards shards and their index."""
    return shard_model.shard_checkpoint(model_dir, model_dir, n_shards)


def read_safetensors(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def write_safetensors(path: Path, header: dict, data: bytes) -> None:
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)
