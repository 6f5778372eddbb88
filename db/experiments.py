"""Reads of an experiment as a whole, behind ``Store.experiment_spec``, ``experiment_mark``,
``policy_groups``, ``experiments_holding`` and ``experiments_measuring``: its spec as it was
run, what changes when one of its runs lands, one policy's ok runs in groups, which
experiments first stored a set of runs, and which hold runs of given boards, classes, engines
or revisions. Each returns plain values (no ORM object
escapes the session that loaded it).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select, union
from sqlalchemy.orm import Session

from db.models import Build, Device, Experiment, ExperimentCount, ExperimentRun, Measurement, Run
from db.queries import GroupSummary, group_rows, summarize_groups

SHORTEST_PREFIX = 4  # a revision, source hash or binary named by fewer characters is no prefix


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


def policy_groups(session: Session, name: str, policy: str) -> tuple[int, list[GroupSummary]]:
    """The experiment's ``writes`` (read first: a run landing meanwhile makes the answer
    stale, never wrong for a newer count), and its ok runs of ``policy`` in groups as
    `status EXPERIMENT` shows them (queries.summarize_groups): read through the runs' kept
    policy and status, so only that policy's ok runs are joined to their measurements."""
    experiment_id, writes = session.execute(
        select(Experiment.id, Experiment.writes).where(Experiment.name == name)).one()
    members = select(ExperimentRun.run_id).where(ExperimentRun.experiment_id == experiment_id)
    rows = session.execute(group_rows().where(Run.id.in_(members), Run.policy == policy,
                                              Run.status == "ok")).all()
    return writes, summarize_groups(rows)


def holding(session: Session, run_keys: Collection[str]) -> list[str]:
    """The names of the experiments that first stored any of these runs, sorted (run keys are
    global: a run belongs to the experiment that first stored it)."""
    return sorted(set(session.scalars(
        select(Experiment.name).join(Run, Run.experiment_id == Experiment.id)
        .where(Run.run_key.in_(run_keys)))))


def boards_among(session: Session, names: Collection[str]) -> set[str]:
    """Those of ``names`` that name a device or a device class."""
    names = set(names)
    found = session.execute(select(Device.name, Device.cls).where(
        or_(Device.name.in_(names), Device.cls.in_(names)))).all()
    return names & {value for row in found for value in row}


def measuring(session: Session, names: Collection[str]) -> list[str]:
    """The experiments, sorted, holding a run measured on a device or a device class in
    ``names``, of an engine in ``names``, or of a build whose revision, source hash or binary
    sha256 starts with one of them (``SHORTEST_PREFIX`` characters at least): what `compare A
    B` reads instead of every experiment. Found through the boards' and builds' indexes."""
    names = sorted(set(names))
    boards = select(Device.id).where(or_(Device.name.in_(names), Device.cls.in_(names)))
    prefixes = [name for name in names if len(name) >= SHORTEST_PREFIX]
    builds = select(Build.id).where(or_(*(column.startswith(prefix, autoescape=True)
                                          for prefix in prefixes
                                          for column in (Build.revision, Build.source_hash,
                                                         Build.binary_sha256)))) \
        if prefixes else None
    runs = [select(Measurement.run_id).where(Measurement.device_id.in_(boards)),
            select(Run.id).where(Run.engine.in_(names))]
    if builds is not None:
        runs.append(select(Run.id).where(Run.build_id.in_(builds)))
    held = select(ExperimentRun.experiment_id).where(ExperimentRun.run_id.in_(union(*runs)))
    return list(session.scalars(select(Experiment.name).where(Experiment.id.in_(held))
                                .order_by(Experiment.name)))
