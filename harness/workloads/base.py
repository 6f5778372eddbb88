"""What every workload kind declares: its spec axes and settings, the engine command that runs
it, how its material (token ids, answer) is made, and how a run's outcome is scored.

A kind is one small object (``needle``, ``ppl``, ``decode``, ``attn-bench``, each in its own
module); ``harness.workloads.kinds`` lists them. The spec's ``[[workload]]`` tables are checked
against a kind's axes and settings (``harness.spec.workloads``), the planner asks it for the
material of every point (``material``), and the driver asks it to score what a run produced
(``score``). Nothing else in the harness knows the kinds by name.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from db.records import Outcome


@dataclass(frozen=True)
class Axis:
    """A crossed spec key of a kind: a scalar or a list of values, each checked."""

    name: str
    type: str  # "int" | "float"
    default: list[Any] | None  # None: required
    low: float = 1
    high: float | None = None


@dataclass(frozen=True)
class Setting:
    """A scalar spec key of a kind (not crossed)."""

    name: str
    default: Any  # None: optional, left out of the workload's parameters when absent
    type: str = "int"  # "int" (>= low) | "file" (a text file relative to the spec's folder)
    low: int = 1
    # a setting that changes how a run uses the workload, not its ids (max_new): left out of
    # the workload's identity, so runs differing in it share one workload row
    per_run: bool = False


@dataclass
class Material:
    """One workload point made: what identifies it, its ids, and what scoring needs."""

    kind: str
    params: dict[str, Any]  # what identifies it (per-run settings left out)
    hash: str
    ids: tuple[int, ...] | None  # None: the engine makes its own data (attn-bench)
    answer: str | None = None
    needle_span: Any = None
    stop_id: int | None = None


class WorkloadKind:
    """The base of every kind; a kind overrides what applies to it."""

    name: str
    command: str  # the engine-contract command that runs it: generate | ppl | attn-bench
    axes: tuple[Axis, ...]
    settings: tuple[Setting, ...] = ()
    # keys naming its own text, set only where a spec wants it (a filler file relative to the
    # spec's folder instead of the built-in grammar; a needle sentence and its question)
    texts: tuple[str, ...] = ()
    uses_model: bool = True  # False: synthetic data, no model is read (attn-bench)

    def check(self, fail: Any, key: str, axes: dict[str, list[Any]]) -> None:
        """Checks across axes; ``fail(key, message)`` makes the spec's error."""

    def material(self, model_dir: Path | None, params: dict[str, Any]) -> Material:
        """The workload of one point of the axes (per-run settings already left out)."""
        raise NotImplementedError

    def score(self, outcome: Outcome, model_dir: Path | None, material_answer: str | None) -> None:
        """Fill the outcome's quality fields from what the run produced (default: none)."""


def synthetic(kind: str, params: dict[str, Any]) -> Material:
    """A workload the engine generates from its parameters (seeded): named by them."""
    text = json.dumps({"kind": kind, **params}, sort_keys=True)
    return Material(kind, params, hashlib.sha256(text.encode()).hexdigest(), None)
