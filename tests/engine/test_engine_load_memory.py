"""The loader's peak: a checkpoint is converted a chunk at a time from its mapping and each
chunk's pages are given back, so the process's peak RSS stays within 1.15x of the weights as
they stay resident (lmc's ``weights_bytes``), for f32, bf16 and q8 weights, from bf16 and f32
checkpoints, one file or sharded. The embedding table is not among them (lmc reads a row from
the file per lookup): a resident copy would put the peak at 1.3-1.4x with q8 weights. The
model is large enough (about 80-300 MB of weights) that the process's own few MB do not hide
a second copy of the checkpoint, which would put the peak at 1.5-2x."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from fixtures_engine import lmc_json, write_tokens
from util_safetensors import shard_checkpoint

from harness.engines.lmc.memory import resident_bytes

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import qwen3_06b  # noqa: E402

SHAPE = qwen3_06b.Qwen3Shape(hidden=512, layers=12, heads=8, kv_heads=4, head_dim=64,
                             intermediate=3072, vocab=16384)
LIMIT = 1.15


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("load-memory")
    models = qwen3_06b.generate(root, shape=SHAPE, seed=3)
    sharded = root / "bf16-sharded"
    shutil.copytree(models["BF16"], sharded)
    shard_checkpoint(sharded, 3)
    return {"f32": models["F32"], "bf16": models["BF16"], "bf16-sharded": sharded}


@pytest.mark.parametrize(("checkpoint", "wq"), [
    ("bf16", "q8"), ("bf16", "bf16"), ("bf16", "f32"), ("f32", "f32"), ("f32", "q8"),
    ("bf16-sharded", "q8"), ("bf16-sharded", "bf16")])
def test_peak_rss_at_load_is_within_1_15x_of_the_resident_weights(lmc, checkpoints, tmp_path,
                                                                   checkpoint, wq):
    prompt = write_tokens(tmp_path / "prompt.txt", [1, 2, 3, 4])
    out = lmc_json(lmc, "generate", "--model", checkpoints[checkpoint], "--prompt", prompt,
                   "--max-new", 2, "--threads", 2, "--wq", wq)
    weights, peak = out["weights_bytes"], out["peak_rss_kb"] * 1024
    file_bytes = sum(p.stat().st_size for p in checkpoints[checkpoint].glob("*.safetensors"))
    assert weights > 25e6 and file_bytes > 25e6  # large enough for a second copy to show
    assert peak <= LIMIT * weights, (f"peak {peak / 1e6:.1f} MB for {weights / 1e6:.1f} MB of "
                                     f"weights ({peak / weights:.2f}x)")
    # the harness's estimate before a run (harness.plan.fit) is the engine's own figure
    config = json.loads((checkpoints[checkpoint] / "config.json").read_text())
    assert resident_bytes(config, wq) == weights


def test_sharded_and_single_files_give_the_same_output(lmc, checkpoints, tmp_path):
    prompt = write_tokens(tmp_path / "prompt.txt", [5, 6, 7, 8])
    runs = [lmc_json(lmc, "generate", "--model", checkpoints[name], "--prompt", prompt,
                     "--max-new", 3, "--wq", "q8") for name in ("bf16", "bf16-sharded")]
    assert runs[0]["tokens"] == runs[1]["tokens"]
    assert runs[0]["weights_bytes"] == runs[1]["weights_bytes"]
