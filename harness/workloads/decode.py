"""``decode``: a chat prompt of filler and a request, for decode speed (nothing is scored)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.workloads.base import Axis, Material, Setting, WorkloadKind
from harness.workloads.prompts import decode_prompt


class Decode(WorkloadKind):
    name = "decode"
    command = "generate"
    axes = (Axis("ctx", "int", None), Axis("seed", "int", [0], low=0))
    settings = (Setting("max_new", 32, per_run=True),)
    texts = ("filler",)

    def material(self, model_dir: Path | None, params: dict[str, Any]) -> Material:
        stream = decode_prompt(model_dir, params["ctx"], params["seed"],
                               params.get("filler", "grammar"))
        return Material(self.name, params, stream.hash, tuple(stream.ids),
                        stop_id=stream.stop_ids[0] if stream.stop_ids else None)


DECODE = Decode()
