"""The workload kinds, and a point of one kind's axes.

To add a kind: a module with its ``WorkloadKind`` (harness.workloads.base) and one line in
``KINDS``; its flags for an engine go in that engine's adapter (lmc:
harness.engines.lmc.run_options).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.workloads.attn_bench import ATTN_BENCH
from harness.workloads.base import WorkloadKind
from harness.workloads.decode import DECODE
from harness.workloads.needle import NEEDLE
from harness.workloads.ppl import PPL

KINDS: dict[str, WorkloadKind] = {k.name: k for k in (NEEDLE, PPL, DECODE, ATTN_BENCH)}


@dataclass(frozen=True)
class WorkloadPoint:
    """One point of a workload's axes, with its scalar settings (max_new, runs ...)."""

    kind: str
    params: tuple[tuple[str, Any], ...]  # sorted by name

    def get(self, name: str) -> Any:
        return dict(self.params)[name]

    @property
    def workload_kind(self) -> WorkloadKind:
        return KINDS[self.kind]

    @property
    def command(self) -> str:
        return KINDS[self.kind].command

    def identity(self) -> dict[str, Any]:
        """The parameters that identify the workload (per-run settings left out)."""
        per_run = {s.name for s in KINDS[self.kind].settings if s.per_run}
        return {k: v for k, v in self.params if k not in per_run}

    def label(self) -> str:
        """For progress lines: a filler or text file by its name (the full path is in the stored
        parameters), a needle template as "own"."""
        shown = {k: Path(v).name if k in ("filler", "text")
                 else "own" if k in ("needle", "question") else v for k, v in self.params}
        return self.kind + " " + " ".join(f"{k}={v}" for k, v in shown.items())
