"""Which measurements of a run the reads use: each run's current one, all, or a time window.

A run (``runs``) has one measurement per attempt (``measurements``, append-only). Reports,
compare, audit and the CLI read each run's *current* measurement: its latest ok one that counts
(made under a live lease), else its latest. The store keeps it on the run's row as measurements
land (``runs.current_measurement_id``, db.rows.refresh_runs, by the rule ``counted_ok`` and
``current_rule`` say here); ``current_measurements(Selection(...), runs)`` is the one query
that reads which measurements to use; anything reading measurements (reports, a history across
revisions) joins it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, Select, case, false, func, select

from db.models import Measurement, Run


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


def current_rule() -> ColumnElement[int]:
    """Over a run's measurements (grouped by run): the id of its current one."""
    latest_ok = func.max(case((counted_ok(), Measurement.id)))
    return func.coalesce(latest_ok, func.max(Measurement.id))


def current_measurements(selection: Selection = CURRENT, runs: Select | None = None) -> Select:
    """(run_id, measurement_id) of the measurements ``selection`` names, one per run unless it
    asks for all, of the runs ``runs`` selects (a select of run ids; None: every run): the
    data a history or a report reads. Each run's current one is read off its row; a window or
    every measurement is chosen among the runs' measurements."""
    if selection == CURRENT:
        query = select(Run.id.label("run_id"),
                       Run.current_measurement_id.label("measurement_id")).where(
            Run.current_measurement_id.is_not(None))
        return query if runs is None else query.where(Run.id.in_(runs))
    chosen = [*selection.window(), *([] if runs is None else [Measurement.run_id.in_(runs)])]
    if selection.all_measurements:
        return select(Measurement.run_id, Measurement.id.label("measurement_id")).where(*chosen)
    return (select(Measurement.run_id, current_rule().label("measurement_id"))
            .where(*chosen).group_by(Measurement.run_id))
