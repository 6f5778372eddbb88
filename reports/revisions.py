"""Which engine revisions a report shows in full.

An experiment tracked every night holds hundreds of engine revisions. Its history section
follows every one of them (a timeline per metric and device); every other section has a row or
a chart per config and revision, so a report of all of them grows with the experiment's age (a
thousand revisions: 26,000 charts, 195,000 table rows, a 140 MB page). Those sections show the
newest revisions instead, and say how many were left to the history and to runs.csv.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `benchfarm report --help` reads NEWEST_REVISIONS without pandas
    import pandas as pd

    from reports.runs import ExperimentData

NEWEST_REVISIONS = 10  # shown in full by default: about two weeks of nightly runs

RevisionOrder = Callable[[list[str]], list[str]]  # revisions -> the same in commit order


def revisions_in_order(runs: pd.DataFrame, revision_order: RevisionOrder | None) -> list[str]:
    """The runs' engine revisions, oldest first: in commit order where ``revision_order``
    knows them, the others in the order of their first run (a report's flattened runs; a
    history's runs are ordered so by ``reports.history.first_run_order``)."""
    if runs.empty:
        return []
    by_first_run = runs.sort_values("run_id", kind="mergesort")["build_revision"].dropna()
    seen = [str(revision) for revision in dict.fromkeys(by_first_run)]
    return revision_order(seen) if revision_order and len(seen) > 1 else seen


@dataclass
class ShownRevisions:
    data: ExperimentData  # the runs shown in full: those of the newest revisions
    revisions: list[str]  # the revisions shown, oldest first
    total: int  # how many revisions the experiment holds

    @property
    def left_out(self) -> int:
        return self.total - len(self.revisions)

    def note(self) -> str:
        """What the sections below the history show (empty when they show every revision)."""
        if not self.left_out:
            return ""
        return (f"The sections below the history show the newest {len(self.revisions)} of "
                f"the experiment's {self.total} engine revisions (from {self.revisions[0][:12]} "
                f"to {self.revisions[-1][:12]}); the history follows all of them, and runs.csv "
                "holds every run. `benchfarm report EXPERIMENT --revisions all` shows every "
                "revision in full.")


def newest_revisions(data: ExperimentData, order: list[str],
                     count: int | None) -> ShownRevisions:
    """The experiment's runs of its newest ``count`` revisions in ``order`` (every revision
    when ``count`` is None), with the runs that name no revision."""
    if count is not None and count < 1:
        raise ValueError(f"revisions to show: {count}; give 1 or more, or all")
    if count is None or len(order) <= count:
        return ShownRevisions(data, order, len(order))
    shown = order[-count:]
    runs = data.runs
    kept = runs[runs["build_revision"].isin(shown) | runs["build_revision"].isna()]
    ids = set(kept["measurement_id"])

    def of_kept(frame: pd.DataFrame) -> pd.DataFrame:
        if "measurement_id" not in frame:
            return frame
        return frame[frame["measurement_id"].isin(ids)]

    return ShownRevisions(replace(data, runs=kept, steps=of_kept(data.steps),
                                  snapshots=of_kept(data.snapshots)), shown, len(order))
