"""``needle``: a chat prompt hiding one fact at a depth of its haystack; recall is whether the
generated answer states the fact's value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from db.records import Outcome
from harness.workloads.base import Axis, Material, Setting, WorkloadKind
from harness.workloads.prompts import check_answer, needle_prompt
from harness.workloads.text import DEFAULT_NEEDLE, NeedleTemplate


class Needle(WorkloadKind):
    name = "needle"
    command = "generate"
    axes = (Axis("ctx", "int", None), Axis("depth", "float", [0.5], low=0.0, high=1.0),
            Axis("seed", "int", [0], low=0))
    settings = (Setting("max_new", 16, per_run=True),)
    texts = ("filler", "needle", "question")

    def material(self, model_dir: Path | None, params: dict[str, Any]) -> Material:
        template = NeedleTemplate(needle=params.get("needle", DEFAULT_NEEDLE.needle),
                                  question=params.get("question", DEFAULT_NEEDLE.question))
        prompt = needle_prompt(model_dir, params["ctx"], params["depth"], params["seed"],
                               params.get("filler", "grammar"), template)
        return Material(self.name, params, prompt.hash, tuple(prompt.ids), prompt.answer,
                        prompt.needle_span, prompt.stop_ids[0] if prompt.stop_ids else None)

    def score(self, outcome: Outcome, model_dir: Path | None, material_answer: str | None) -> None:
        if outcome.generated_ids is None or material_answer is None or model_dir is None:
            return
        outcome.expected_answer = material_answer
        outcome.recall = 1.0 if check_answer(model_dir, outcome.generated_ids,
                                             material_answer) else 0.0


NEEDLE = Needle()
