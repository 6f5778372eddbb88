"""`benchfarm run --dry-run`: how big a matrix is and how long it would take, running nothing.

The time comes from stored durations: each cell takes the median wall time of the stored ok
runs most like it — the same board, engine, command, the axes its duration depends on (the
adapter's ``timing_columns``: lmc's policy and k) and context (or text length); else the same
board and command; else the same work on any board. A cell with none of these counts as
unknown. Boards work in parallel, one run at a time, with the spec's cool-down after each; a
pooled run goes to the pool's least loaded board; each board's warm-ups (``warmups`` runs per
build it runs, timed as its first run) are counted. Runs already stored as ok (named by their
run keys from the builds' identities, nothing built; for engines whose runs can be named
without building) are left out of the time.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from db.queries import RunDuration
from harness.engines import ENGINES, adapter_of
from harness.plan.matrix import Cell, Placement, expand
from harness.spec import Spec


@dataclass
class Estimate:
    runs: int
    per_placement: dict[str, int]
    board_s: dict[str, float] = field(default_factory=dict)  # seconds of work per board
    unknown: int = 0  # runs without any stored duration to go by
    stored: int = 0  # runs already stored as ok: a run skips them

    @property
    def total_s(self) -> float:
        return max(self.board_s.values(), default=0.0)

    def lines(self) -> list[str]:
        known = self.runs - self.unknown - self.stored
        out = [f"  {key}: {count} runs" for key, count in self.per_placement.items()]
        if self.stored:
            out.append(f"  {self.stored} of them already stored as ok: skipped, not timed")
        todo = self.runs - self.stored
        if todo and not known:  # nothing to go by: no figure, not a time of 0 s
            out.append(f"estimated time: unknown (none of the {todo} runs to do has a stored "
                       "run like it; the estimate comes from stored durations)")
            return out
        out += [f"  board {name}: about {duration_text(s)} of work"
                for name, s in sorted(self.board_s.items())]
        # runs without a stored duration are left out: the time is a lower bound then
        bound = "at least " if self.unknown else ""
        out.append(f"estimated time: {bound}{duration_text(self.total_s)} ({known} of {todo} "
                   "runs to do estimated from stored durations, with each board's "
                   "warm-ups; boards run in parallel; not counted: Ray's start, builds, "
                   "workload generation)")
        if self.unknown:
            out.append(f"  {self.unknown} runs have no stored run like them: the estimate "
                       "leaves them out")
        return out


def duration_text(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _size(params: dict) -> object:
    return params.get("ctx", params.get("length"))


def _work(engine: str, command: str, columns: dict[str, Any], params: dict) -> tuple:
    """What a run's duration depends on: its engine and command, the axes its adapter names
    (``timing_columns``) and its size."""
    axes = adapter_of(engine).timing_columns if engine in ENGINES else ()
    return (engine, command, *(columns.get(name) for name in axes), _size(params))


class Durations:
    """Median stored wall times (seconds), looked up from the most to the least specific."""

    def __init__(self, runs: Sequence[RunDuration]) -> None:
        samples: dict[tuple, list[float]] = defaultdict(list)
        for run in runs:
            work = _work(run.engine, run.command, run.columns, run.workload)
            seconds = run.wall_ms / 1000.0
            samples[("board", run.device, *work)].append(seconds)
            samples[("command", run.device, run.command)].append(seconds)
            samples[("anywhere", *work)].append(seconds)
        self.medians = {key: statistics.median(values) for key, values in samples.items()}

    def seconds(self, cell: Cell, board: str) -> float | None:
        workload = cell.workload
        work = _work(cell.engine, workload.command, cell.config.columns(), dict(workload.params))
        for key in (("board", board, *work), ("command", board, workload.command),
                    ("anywhere", *work)):
            if key in self.medians:
                return self.medians[key]
        return None


def estimate(spec: Spec, placements: Sequence[Placement],
             stored: Sequence[RunDuration], done: Collection[Cell] = ()) -> Estimate:
    """The estimate of a matrix small enough to plan (see harness.plan.matrix.check_size); ``done``:
    its cells already stored as ok, which take no time."""
    durations = Durations(stored)
    cells = expand(spec, placements)
    per_placement = {p.key: 0 for p in placements}
    result = Estimate(len(cells), per_placement)
    load = {name: 0.0 for p in placements for name in p.devices}
    warmed: set[tuple[str, str, str]] = set()  # (board, engine, revision): its build warmed up
    for cell in cells:
        per_placement[cell.placement.key] += 1
        if cell in done:
            result.stored += 1
            continue
        board = min(cell.placement.devices, key=lambda name: load[name])
        seconds = durations.seconds(cell, board)
        if seconds is None:
            result.unknown += 1
            continue
        load[board] += seconds + spec.cooldown_s
        if (board, cell.engine, cell.revision) not in warmed:  # a board warms each build up
            warmed.add((board, cell.engine, cell.revision))
            load[board] += spec.warmups * (seconds + spec.cooldown_s)
    result.board_s = load
    return result
