"""The wall screen's per-board timeline of the last 24 hours: for each board, spans of
busy (with the job it ran), idle, maintenance, bad, retired and reserved.

Each moment of a board is one kind, the first that holds: busy (an attempt in flight on it),
then its stored state if not online (bad, maintenance, retired), then reserved (a reservation
in force), else idle. A busy span names the job of its experiment that was running then."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from db.board_days import BoardDays, JobSpan

WINDOW = timedelta(hours=24)
KINDS = ("busy", "bad", "maintenance", "retired", "reserved", "idle")


@dataclass(frozen=True)
class Span:
    kind: str  # one of KINDS
    start: datetime
    end: datetime
    job: int | None  # busy: the job that ran it, when one was running its experiment
    label: str  # busy: "job 7 (needle)"; reserved: the owner; a state: the state


@dataclass(frozen=True)
class BoardTimeline:
    board: str
    spans: list[Span]  # in time order, covering the window without gaps


def _job_of(jobs: list[JobSpan], experiment: str, moment: datetime,
            now: datetime) -> JobSpan | None:
    return next((j for j in jobs if j.experiment == experiment and j.started <= moment
                 <= (j.finished or now)), None)


def timelines(days: BoardDays, boards: list[str], now: datetime,
              window: timedelta = WINDOW) -> list[BoardTimeline]:
    since = now - window
    result = []
    for board in boards:
        busy = [(max(a.started, since), min(a.finished or now, now), a.experiment)
                for a in days.attempts if a.board == board]
        kept = [(max(r.starts, since), min(r.ends, now), r.owner)
                for r in days.reservations if r.board == board]
        changes = [(state, at) for name, state, at in days.changes if name == board]
        cuts = {since, now, *(t for s, e, _ in busy + kept for t in (s, e)),
                *(at for _, at in changes if since < at < now)}
        moments = sorted(t for t in cuts if since <= t <= now)
        spans: list[Span] = []
        for start, end in zip(moments, moments[1:], strict=False):
            if end <= start:
                continue
            middle = start + (end - start) / 2
            spans.append(_kind_at(middle, start, end, busy, kept, changes, days.jobs, now))
        result.append(BoardTimeline(board, _merged(spans)))
    return result


def _kind_at(middle: datetime, start: datetime, end: datetime, busy: list, kept: list,
             changes: list, jobs: list[JobSpan], now: datetime) -> Span:
    running = next((experiment for s, e, experiment in busy if s <= middle < e), None)
    if running is not None:
        job = _job_of(jobs, running, middle, now)
        label = f"job {job.id} ({running})" if job else running
        return Span("busy", start, end, job.id if job else None, label)
    state = next((s for s, at in reversed(changes) if at <= middle), "online")
    if state != "online":
        return Span(state, start, end, None, state)
    owner = next((o for s, e, o in kept if s <= middle < e), None)
    if owner is not None:
        return Span("reserved", start, end, None, f"reserved by {owner}")
    return Span("idle", start, end, None, "idle")


def _merged(spans: list[Span]) -> list[Span]:
    out: list[Span] = []
    for span in spans:
        last = out[-1] if out else None
        if last and (last.kind, last.job, last.label) == (span.kind, span.job, span.label):
            out[-1] = Span(last.kind, last.start, span.end, last.job, last.label)
        else:
            out.append(span)
    return out
