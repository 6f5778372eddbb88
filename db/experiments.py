"""Reads of an experiment as a whole, behind ``Store.experiment_spec``, ``experiment_mark`` and
``experiments_holding``: its spec as it was run, what changes when one of its runs lands, and
which experiments first stored a set of runs. Each returns plain values (no ORM object
escapes the session that loaded it).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import Experiment, ExperimentCount, Run


@dataclass(frozen=True)
class StoredSpec:
    """The spec an experiment was last run with."""

    text: str  # the spec file as it was run
    hash: str


def spec(session: Session, name: str) -> StoredSpec:
    """The spec of the experiment ``name`` (which the caller knows is stored)."""
    row = session.scalar(select(Experiment).where(Experiment.name == name))
    return StoredSpec(row.spec_text, row.spec_hash)


def mark(session: Session, name: str) -> tuple[Any, ...]:
    """What changes when the experiment gets a new attempt, a new run, or an attempt of it
    ends (running becomes ok, failed, lost ...): the writes to its runs' measurements and its
    runs per status (both kept by the store as runs land: no run is read)."""
    experiment_id, writes = session.execute(
        select(Experiment.id, Experiment.writes).where(Experiment.name == name)).first() \
        or (None, None)
    counts = session.execute(select(ExperimentCount.status, ExperimentCount.runs)
                             .where(ExperimentCount.experiment_id == experiment_id)
                             .order_by(ExperimentCount.status)).all()
    return (writes, *(tuple(row) for row in counts))


def holding(session: Session, run_keys: Collection[str]) -> list[str]:
    """The names of the experiments that first stored any of these runs, sorted (run keys are
    global: a run belongs to the experiment that first stored it)."""
    return sorted(set(session.scalars(
        select(Experiment.name).join(Run, Run.experiment_id == Experiment.id)
        .where(Run.run_key.in_(run_keys)))))
