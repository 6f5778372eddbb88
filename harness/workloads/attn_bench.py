"""``attn-bench``: attention alone on seeded synthetic q, k, v, at context lengths no small
model reaches; no model is read, the workload is named by its parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.workloads.base import Axis, Material, Setting, WorkloadKind, synthetic


class AttentionBench(WorkloadKind):
    name = "attn-bench"
    command = "attn-bench"
    axes = (Axis("ctx", "int", None), Axis("heads", "int", [16]), Axis("kv_heads", "int", [8]),
            Axis("head_dim", "int", [128]))
    # layers: copies of the layer attended in turn (lmc attn-bench --layers), so the KV comes
    # from memory as in decode; optional, left out (one layer) so that runs keep their keys
    settings = (Setting("runs", 5), Setting("seed", 0, low=0), Setting("layers", None))
    uses_model = False

    def check(self, fail: Any, key: str, axes: dict[str, list[Any]]) -> None:
        for heads, kv_heads in ((h, g) for h in axes["heads"] for g in axes["kv_heads"]):
            if heads % kv_heads:
                raise fail(f"{key}.kv_heads",
                           f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")

    def material(self, model_dir: Path | None, params: dict[str, Any]) -> Material:
        return synthetic(self.name, params)


ATTN_BENCH = AttentionBench()
