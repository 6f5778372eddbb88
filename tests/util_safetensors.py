"""Reading, writing and sharding safetensors files byte by byte (any dtype, BF16 included),
for tests that build or break checkpoints."""

from __future__ import annotations

import json
import struct
from pathlib import Path


def read_safetensors(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def write_safetensors(path: Path, header: dict, data: bytes) -> None:
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def shard_checkpoint(model_dir: Path, n_shards: int) -> dict:
    """Split model_dir/model.safetensors into n_shards files (tensors dealt round-robin) and a
    model.safetensors.index.json, as transformers names them; remove the single file. Returns
    the index."""
    single = model_dir / "model.safetensors"
    header, data = read_safetensors(single)
    names = sorted(k for k in header if k != "__metadata__")
    files = [f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors" for i in range(n_shards)]
    weight_map = {}
    for s, file in enumerate(files):
        part_header: dict = {"__metadata__": {"format": "pt"}}
        chunks: list[bytes] = []
        offset = 0
        for name in names[s::n_shards]:
            entry = dict(header[name])
            begin, end = entry["data_offsets"]
            chunks.append(data[begin:end])
            entry["data_offsets"] = [offset, offset + end - begin]
            offset += end - begin
            part_header[name] = entry
            weight_map[name] = file
        write_safetensors(model_dir / file, part_header, b"".join(chunks))
    index = {"metadata": {"total_size": len(data)}, "weight_map": weight_map}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    single.unlink()
    return index
