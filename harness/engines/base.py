"""What every engine adapter provides, and the measurements they all map their output to.

An engine (``lmc``, ``llama-bench`` ...) is one small class: how to build it for a target, what
its model artifact is and how it is identified, its own spec section (validated into frozen
config records), the argv of one run on a device, the parse of its stdout into common
:class:`Measurements` (plus an engine-specific ``extra`` kept verbatim), and a health command.
The runner, the plan and the reports only talk to engines through this interface.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.build import BuildRecord


@dataclass
class Measurements:
    """The figures every engine reports in the same units (milliseconds, tokens)."""

    prefill_ms: float | None = None  # the whole prompt's forward pass
    decode_ms_per_token: float | None = None  # one generated token
    attn_ms_per_token: float | None = None  # attention's share of it, where measured
    prompt_tokens: int | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)  # per decode step: token, ms
    extra: dict[str, Any] = field(default_factory=dict)  # engine-specific, stored verbatim


@dataclass(frozen=True)
class Artifact:
    """A model as an engine consumes it: a directory (pushed as a tree) or one file."""

    path: Path
    sha256: str  # identity in run keys and the models table
    info: dict[str, Any]  # stored with the model row (config.json, GGUF type ...)

    @property
    def is_tree(self) -> bool:
        return self.path.is_dir()


class Engine(Protocol):
    """One engine behind the harness."""

    name: str

    def build(self, target: str, revision: str | None) -> BuildRecord:
        """Build (or find cached) the engine binary for ``target``."""
        ...

    def argv(self, command: str, binary: str, model: str | None, stdin_ids: bool,
             options: Sequence[str]) -> list[str]:
        """The command line on the device; paths are the device's (pushed) paths."""
        ...

    def parse(self, stdout: str, command: str) -> Any:
        """The engine's stdout of ``command`` as data; raises ValueError when it is not the
        engine's output (board output is untrusted: check what later code relies on)."""
        ...

    def measurements(self, command: str, data: Any) -> Measurements:
        """The common figures of one parsed output."""
        ...

    def health_argv(self, binary: str) -> list[str]:
        """A quick command that proves the binary runs on a device."""
        ...

    def health_verdict(self, stdout: str, stderr: str, arch: str) -> tuple[bool, str]:
        """Whether the health command's output (it exited 0) shows a working engine on a
        device of ``arch``, and a line that says what it showed."""
        ...
