"""Which measurements of a run the reads use: each run's current one, all, or a time window.

A run (``runs``) has one measurement per attempt (``measurements``, append-only). Reports,
compare, audit and the CLI read each run's *current* measurement: its latest ok one that counts
(made under a live lease), else its latest. ``current_measurements(Selection(...))`` is the one
query that says so; anything reading measurements (reports, a history across revisions) joins
it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, Select, case, false, func, select

from db.models import Measurement


@dataclass(frozen=True)
class Selection:
    """Which measurements of each run reads use.

    By default each run's current one: its latest ok measurement (made under a live lease),
    else its latest. ``all_measurements``: every one. ``since``/``until`` (naive UTC) keep the
    measurements started in that window (the current one is then chosen among them).
    """

    all_measurements: bool = False
    since: datetime | None = None
    until: datetime | None = None

    def window(self) -> list[ColumnElement[bool]]:
        started = Measurement.started_at
        return ([started >= self.since] if self.since else []) + \
            ([started <= self.until] if self.until else [])


CURRENT = Selection()  # each run's current measurement


def counted_ok() -> ColumnElement[bool]:
    """An ok measurement that counts as the run's: not made under an expired lease."""
    return (Measurement.status == "ok") & (Measurement.lease_expired == false())


def current_measurements(selection: Selection = CURRENT) -> Select:
    """(run_id, measurement_id) of the measurements ``selection`` names, one per run unless it
    asks for all: the data a history or a report reads."""
    if selection.all_measurements:
        return select(Measurement.run_id, Measurement.id.label("measurement_id")) \
            .where(*selection.window())
    latest_ok = func.max(case((counted_ok(), Measurement.id)))
    return (select(Measurement.run_id,
                   func.coalesce(latest_ok, func.max(Measurement.id)).label("measurement_id"))
            .where(*selection.window()).group_by(Measurement.run_id))
