"""``ppl``: a stream of plain text (the filler's held-out stream, or windows of a text file)
for teacher-forced perplexity; the engine's nll and ppl are the outcome."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.workloads.base import Axis, Material, Setting, WorkloadKind
from harness.workloads.prompts import ppl_tokens


class Perplexity(WorkloadKind):
    name = "ppl"
    command = "ppl"
    axes = (Axis("length", "int", None), Axis("seed", "int", [0], low=0))
    settings = (Setting("text", None, type="file"),)
    texts = ("filler",)

    def material(self, model_dir: Path | None, params: dict[str, Any]) -> Material:
        stream = ppl_tokens(model_dir, params["length"], params["seed"],
                            params.get("filler", "grammar"), text=params.get("text"))
        return Material(self.name, params, stream.hash, tuple(stream.ids))


PPL = Perplexity()
