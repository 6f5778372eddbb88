"""Split a Hugging Face model directory's ``model.safetensors`` into shards and a
``model.safetensors.index.json`` (the layout ``save_pretrained(max_shard_size=...)`` writes),
copying the other files (config.json, tokenizer, ...) along.

Tensors are dealt to the shards round-robin in name order, so every shard holds some; data is
copied one tensor at a time (memory stays near the largest tensor). lmc reads either layout;
the benches and tests use this to compare them on the same weights.

    .venv/bin/python bench/shard_model.py SRC_DIR DST_DIR --shards 4
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
from pathlib import Path

INDEX = "model.safetensors.index.json"


def read_header(path: Path) -> tuple[dict, int]:
    """The JSON header of a safetensors file and the offset of its data section."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n)), 8 + n


def shard_checkpoint(src: Path, dst: Path, n_shards: int) -> dict:
    """Write dst/model-0000i-of-0000n.safetensors + the index from src/model.safetensors and
    copy src's other files; dst may be src (the single file is then removed). Returns the
    index."""
    single = src / "model.safetensors"
    header, data_start = read_header(single)
    names = sorted(k for k in header if k != "__metadata__")
    if not 1 <= n_shards <= len(names):
        raise ValueError(f"--shards must be between 1 and the {len(names)} tensors")
    dst.mkdir(parents=True, exist_ok=True)
    if dst.resolve() != src.resolve():
        for item in src.iterdir():
            if item.is_file() and item.name != single.name:
                shutil.copy2(item, dst / item.name)
    files = [f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors" for i in range(n_shards)]
    weight_map: dict[str, str] = {}
    with open(single, "rb") as source:
        for s, file in enumerate(files):
            part: dict = {"__metadata__": {"format": "pt"}}
            offset = 0
            for name in names[s::n_shards]:
                begin, end = header[name]["data_offsets"]
                part[name] = dict(header[name], data_offsets=[offset, offset + end - begin])
                offset += end - begin
                weight_map[name] = file
            blob = json.dumps(part).encode()
            with open(dst / file, "wb") as out:
                out.write(struct.pack("<Q", len(blob)) + blob)
                for name in names[s::n_shards]:
                    begin, end = header[name]["data_offsets"]
                    source.seek(data_start + begin)
                    out.write(source.read(end - begin))
    total = sum(e - b for b, e in (header[n]["data_offsets"] for n in names))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (dst / INDEX).write_text(json.dumps(index, indent=2))
    if dst.resolve() == src.resolve():
        single.unlink()
    return index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="model directory with model.safetensors")
    parser.add_argument("dst", type=Path, help="output directory (may be src)")
    parser.add_argument("--shards", type=int, default=2)
    args = parser.parse_args(argv)
    if not (args.src / "model.safetensors").is_file():
        parser.error(f"{args.src}: no model.safetensors")
    try:
        index = shard_checkpoint(args.src, args.dst, args.shards)
    except ValueError as exc:
        parser.error(str(exc))
    print(json.dumps({"dst": str(args.dst), "shards": sorted(set(index["weight_map"].values()))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
