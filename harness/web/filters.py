"""The wall screen's filters: by board, owner, experiment and state, from a page's query
(``?board=x86-1&owner=ana&experiment=needle&state=running``), applied alike to the page and to
the JSON lists its live script reads (it passes the page's query on).

``state`` is a job's (queued, running, done, failed, cancelled) or a board's (online,
maintenance, retired, bad): the two sets do not overlap, so one field filters whichever it
names. ``experiment`` matches part of a name, the others match whole values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from db.boards import BOARD_STATES
from db.jobs import JOB_STATES

MAX_FILTER_CHARS = 200
FIELDS = ("board", "owner", "experiment", "state")


@dataclass(frozen=True)
class Filters:
    board: str = ""
    owner: str = ""
    experiment: str = ""
    state: str = ""

    @classmethod
    def of(cls, query: Mapping[str, str]) -> Filters:
        """From a request's query; ValueError names a state no job or board has."""
        found = {name: (query.get(name) or "").strip()[:MAX_FILTER_CHARS] for name in FIELDS}
        if found["state"] and found["state"] not in (*JOB_STATES, *BOARD_STATES):
            raise ValueError(f"state={found['state']!r}: a job's state "
                             f"({', '.join(JOB_STATES)}) or a board's ({', '.join(BOARD_STATES)})")
        return cls(**found)

    @property
    def any(self) -> bool:
        return any(getattr(self, name) for name in FIELDS)

    def _names_experiment(self, name: str) -> bool:
        return self.experiment.lower() in name.lower()

    def boards(self, boards: list[Any]) -> list[Any]:
        return [b for b in boards
                if (not self.board or b.name == self.board)
                and (self.state not in BOARD_STATES or b.state == self.state)
                and (not self.experiment or self._names_experiment(b.experiment or ""))]

    def jobs(self, jobs: list[Any], classes: Mapping[str, str | None]) -> list[Any]:
        """Jobs of the owner, experiment and state asked for; with a board, those whose
        matrix places runs on it, by its name or by its class (``classes``: board -> class)."""
        placed = {self.board, classes.get(self.board)} - {None, ""}
        return [j for j in jobs
                if (not self.owner or j.owner == self.owner)
                and (not self.experiment or self._names_experiment(j.experiment))
                and (self.state not in JOB_STATES or j.state == self.state)
                and (not self.board or any(p.placement in placed for p in j.placements))]

    def experiments(self, rows: list[Any]) -> list[Any]:
        return [row for row in rows if not self.experiment or self._names_experiment(row.name)]
