"""``lmc``, this project's engine, behind the adapter interface.

Builds go through :func:`harness.build.build_engine` (ninja, per target and git revision); the
model is a Hugging Face directory pushed as a tree; token ids travel on standard input; the
output is the one JSON document of the engine contract (engine/README.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness import engine_output
from harness.build import BuildRecord, build_engine
from harness.engines.base import Measurements

NAME = "lmc"


class LmcEngine:
    name = NAME

    def build(self, target: str, revision: str | None) -> BuildRecord:
        return build_engine(target=target, rev=revision)

    def argv(self, command: str, binary: str, model: str | None, stdin_ids: bool,
             options: Sequence[str]) -> list[str]:
        argv = [binary, command]
        if model is not None:
            argv += ["--model", model]
        if stdin_ids:  # `-`: the ids arrive on standard input
            argv += ["--text" if command == "ppl" else "--prompt", "-"]
        return argv + list(options)

    def parse(self, stdout: str, command: str) -> Any:
        return engine_output.parse(stdout, command)  # the lmc/1 schema, checked

    def measurements(self, command: str, data: Any) -> Measurements:
        return Measurements(
            prefill_ms=data.get("prefill_ms"),
            decode_ms_per_token=data.get("decode_ms_per_token"),
            attn_ms_per_token=data.get("attn_ms_per_token"),
            prompt_tokens=data.get("prompt_tokens"),
            steps=list(data.get("steps", [])) if command == "generate" else [],
        )

    def health_argv(self, binary: str) -> list[str]:
        return [binary, "info"]
