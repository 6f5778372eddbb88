"""Alerts: the steps of an experiment's history at one culprit commit, stored so that a lab can
act on them (Perfherder's alert summaries, grouped per push). Each holds every series (device,
config, metric) that moved at the commit with its levels and ratio; its state starts
``untriaged`` and people move it to ``acknowledged``, ``invalid``, ``wontfix`` or ``fixed``;
each change records who (the caller's identity), when and a note. A later step of the same
series back to the level before the alert marks the step ``back_at`` that commit, and an alert
whose every regression is back becomes ``fix-suggested``, for someone to confirm."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from db.connection import retry_locked
from db.errors import StoreInputError
from db.leases import utcnow
from db.models import Alert, AlertChange, AlertStep
from db.records import ALERT_STATES, SeriesStep

__all__ = ["ALERT_STATES", "OPEN_STATES", "TRIAGE_STATES", "AlertRecord", "Alerts",
           "ChangeRecord", "StepRecord"]

TRIAGE_STATES = ("acknowledged", "invalid", "wontfix", "fixed")  # what a person sets
OPEN_STATES = ("untriaged", "acknowledged")  # a fix may still be suggested for these
SYSTEM = "benchfarm"  # who makes the changes nobody typed (opening, suggesting a fix)


@dataclass(frozen=True)
class StepRecord(SeriesStep):
    """A step an alert holds (at the alert's revision), with its verdict when stored, and the
    later revision that brought its series back to the level before, if any."""

    regression: bool
    back_at: str | None = None


@dataclass(frozen=True)
class ChangeRecord:
    at: datetime
    actor: str
    checked: bool
    state_from: str | None
    state_to: str
    note: str | None


@dataclass
class AlertRecord:
    id: int
    experiment: str
    revision: str
    previous: str | None
    subject: str
    authored_at: str | None
    state: str
    created_at: datetime
    updated_at: datetime
    steps: list[StepRecord] = field(default_factory=list)
    changes: list[ChangeRecord] = field(default_factory=list)

    @property
    def devices(self) -> list[str]:
        return sorted({s.device for s in self.steps})

    @property
    def ratio(self) -> float | None:
        """The geometric mean of its regressions' ratios."""
        ratios = [s.ratio for s in self.steps if s.regression and s.ratio and s.ratio > 0]
        return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None


def _record(session: Session, row: Alert) -> AlertRecord:
    steps = session.scalars(select(AlertStep).where(AlertStep.alert_id == row.id)
                            .order_by(AlertStep.id))
    changes = session.scalars(select(AlertChange).where(AlertChange.alert_id == row.id)
                              .order_by(AlertChange.id))
    return AlertRecord(
        row.id, row.experiment, row.revision, row.previous, row.subject, row.authored_at,
        row.state, row.created_at, row.updated_at,
        [StepRecord(row.revision, s.device, s.config, s.metric, s.before, s.after, s.ratio,
                    s.regression, s.back_at) for s in steps],
        [ChangeRecord(c.at, c.actor, c.checked, c.state_from, c.state_to, c.note)
         for c in changes])


def back_to(step: AlertStep, level: float) -> bool:
    """Whether ``level`` is back at the level before ``step``: nearer (on a log scale) to it
    than to the level after it."""
    if min(step.before, step.after, level) <= 0:
        return False
    return abs(math.log(level / step.before)) < abs(math.log(level / step.after))


class Alerts:
    """The ``alerts`` tables; ``database`` should open write transactions with BEGIN
    IMMEDIATE."""

    def __init__(self, database: Engine) -> None:
        self.database = database

    @retry_locked
    def open(self, experiment: str, revision: str, previous: str | None, subject: str,
             authored_at: str | None, steps: Sequence[StepRecord],
             note: str | None = None) -> tuple[AlertRecord, bool]:
        """The alert of ``revision`` in ``experiment`` with ``steps`` added (those it holds
        already are kept as they are); True when it is new (its opening records ``note``)."""
        moment = utcnow()
        with Session(self.database) as s, s.begin():
            row = s.scalar(select(Alert).where(Alert.experiment == experiment,
                                               Alert.revision == revision))
            new = row is None
            if row is None:
                row = Alert(experiment=experiment, revision=revision, previous=previous,
                            subject=subject[:500], authored_at=authored_at, state="untriaged",
                            created_at=moment, updated_at=moment)
                s.add(row)
                s.flush()
                s.add(AlertChange(alert_id=row.id, at=moment, actor=SYSTEM, checked=False,
                                  state_from=None, state_to="untriaged",
                                  note=note or f"{len(steps)} series moved"))
            held = {(a.device, a.config, a.metric) for a in s.scalars(
                select(AlertStep).where(AlertStep.alert_id == row.id))}
            for step in steps:
                if (step.device, step.config, step.metric) not in held:
                    s.add(AlertStep(alert_id=row.id, device=step.device, config=step.config,
                                    metric=step.metric, before=step.before, after=step.after,
                                    ratio=step.ratio, regression=step.regression))
            s.flush()
            return _record(s, row), new

    @retry_locked
    def steps_back(self, experiment: str, revision: str, device: str, config: str,
                   metric: str, level: float) -> list[AlertRecord]:
        """A step of a series to ``level`` at ``revision``: each open alert of an earlier
        commit of the experiment with a regression of that series it brings back to the level
        before marks it ``back_at`` the revision; those whose every regression is back become
        ``fix-suggested``. Returns the alerts whose state changed."""
        changed = []
        moment = utcnow()
        with Session(self.database) as s, s.begin():
            for step, alert in s.execute(
                    select(AlertStep, Alert).join(Alert, Alert.id == AlertStep.alert_id)
                    .where(Alert.experiment == experiment, Alert.revision != revision,
                           Alert.state.in_(OPEN_STATES), AlertStep.device == device,
                           AlertStep.config == config, AlertStep.metric == metric,
                           AlertStep.regression.is_(True), AlertStep.back_at.is_(None))):
                if not back_to(step, level):
                    continue
                step.back_at = revision
                s.flush()
                rest = s.scalar(select(AlertStep.id).where(
                    AlertStep.alert_id == alert.id, AlertStep.regression.is_(True),
                    AlertStep.back_at.is_(None)).limit(1))
                if rest is None:
                    s.add(AlertChange(alert_id=alert.id, at=moment, actor=SYSTEM, checked=False,
                                      state_from=alert.state, state_to="fix-suggested",
                                      note=f"back to the level before at {revision[:12]}"))
                    alert.state, alert.updated_at = "fix-suggested", moment
                    s.flush()
                    changed.append(_record(s, alert))
        return changed

    @retry_locked
    def change(self, alert_id: int, state: str, actor: str, checked: bool,
               note: str | None) -> tuple[AlertRecord, str]:
        """Move alert ``alert_id`` to ``state`` (one a person sets) for ``actor``; returns it
        and the state it had."""
        if state not in TRIAGE_STATES:
            raise StoreInputError(f"state {state!r}: a person sets one of "
                                  f"{', '.join(TRIAGE_STATES)}")
        moment = utcnow()
        with Session(self.database) as s, s.begin():
            row = s.get(Alert, alert_id)
            if row is None:
                raise StoreInputError(f"no alert {alert_id}; `benchfarm alerts list` shows them")
            before = row.state
            s.add(AlertChange(alert_id=row.id, at=moment, actor=actor, checked=checked,
                              state_from=before, state_to=state, note=note))
            row.state, row.updated_at = state, moment
            s.flush()
            return _record(s, row), before

    def get(self, alert_id: int) -> AlertRecord:
        with Session(self.database) as s:
            row = s.get(Alert, alert_id)
            if row is None:
                raise StoreInputError(f"no alert {alert_id}; `benchfarm alerts list` shows them")
            return _record(s, row)

    def list(self, states: Sequence[str] = (), experiment: str | None = None,
             limit: int = 100) -> list[AlertRecord]:
        """The newest alerts first, of these states (any when none) and experiment."""
        for state in states:
            if state not in ALERT_STATES:
                raise StoreInputError(f"state {state!r}: one of {', '.join(ALERT_STATES)}")
        query = select(Alert).order_by(Alert.id.desc()).limit(limit)
        if states:
            query = query.where(Alert.state.in_(list(states)))
        if experiment:
            query = query.where(Alert.experiment == experiment)
        with Session(self.database) as s:
            return [_record(s, row) for row in s.scalars(query)]
