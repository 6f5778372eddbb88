"""What the dashboard shows: its views, each a dataclass of plain values (boards, jobs,
experiments, a page of a list), and how the JSON API pages and encodes them (``page_bounds``,
``as_json``). harness.web.data reads them from the store; the pages and the API show them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from db.boards import HealthResult, ReservationInfo, StateChange
from db.jobs import PlacementProgress
from db.queries import GroupSummary
from reports.history import History, HistoryStep

PAGE = 50  # experiments per page, and the default of every paged JSON list
MAX_PAGE = 500  # the most any one request may ask for
MAX_JOB_ID = 2**63 - 1  # the store's ids are 64-bit: a larger one is a bad request, not a 500


@dataclass(frozen=True)
class Failure:
    run_id: int
    experiment: str
    finished_at: datetime | None
    error: str | None


@dataclass(frozen=True)
class Health:
    ok: bool
    checked_at: datetime
    checked_by: str
    summary: str  # "ok", or "FAILED" with each failed item and its detail

    @classmethod
    def of(cls, result: HealthResult) -> Health:
        return cls(result.ok, result.checked_at, result.checked_by, result.summary)


@dataclass(frozen=True)
class BoardEvent:
    """A change of the board's state, or something seen on it that left its state as it was
    (``db.boards.Boards.note``: a step `track` put down to the board, not to a commit)."""
    at: datetime
    state: str
    changed_by: str
    reason: str | None

    @classmethod
    def of(cls, change: StateChange) -> BoardEvent:
        return cls(change.at, change.state, change.changed_by, change.reason)


@dataclass(frozen=True)
class Board:
    name: str
    cls: str | None  # None for a board the store has a state or reservation of, but no run
    arch: str | None
    emulated: bool | None
    state: str  # stored: online | maintenance | retired | bad (online when never set)
    reason: str | None  # ... why, as whoever set it wrote
    since: datetime | None  # ... since when (None: never changed)
    changed_by: str | None
    lost_in_a_row: int  # runs lost on it in a row (at the coordinators' limit it turns bad)
    activity: str  # running | warm-up | idle, derived from its lease (data._activity)
    reservation: ReservationInfo | None  # in force now: kept for its owner until it ends
    health: list[Health]  # its newest health checks, newest first
    holder: str | None  # the coordinator holding its lease now
    experiment: str | None  # ... for this experiment
    run_key: str | None  # ... running this run (None during a warm-up)
    lease_expires: datetime | None
    last_run_at: datetime | None
    last_status: str | None
    failures: list[Failure] = field(default_factory=list)
    events: list[BoardEvent] = field(default_factory=list)  # its newest, newest first


@dataclass(frozen=True)
class Placement:
    """One board (or class pool) of a job's matrix: runs done / failed / running / pending."""

    placement: str
    total: int
    done: int
    failed: int
    running: int
    pending: int

    @classmethod
    def of(cls, progress: PlacementProgress) -> Placement:
        return cls(progress.placement, progress.total, progress.done, progress.failed,
                   progress.running, progress.pending)


@dataclass(frozen=True)
class JobView:
    id: int
    experiment: str
    owner: str
    priority: int
    state: str
    kind: str
    holder: str | None
    message: str | None
    submitted_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    elapsed_s: float | None  # since it started (to its end once finished)
    remaining_s: float | None  # at this job's pace so far; None before its first result
    placements: list[Placement]
    total: int
    done: int
    failed: int
    running: int
    pending: int


@dataclass(frozen=True)
class ExperimentRow:
    name: str
    updated_at: datetime
    counts: dict[str, int]
    total: int


@dataclass(frozen=True)
class ExperimentView:
    name: str
    spec_hash: str
    updated_at: datetime
    counts: dict[str, int]
    devices: dict[str, dict[str, int]]
    groups: list[GroupSummary]  # the latest results: medians per command, policy, k, device
    job: JobView | None  # its newest job
    revisions: list[str]  # the engine revisions of its ok runs in commit order, when 2 or more
    steps: list[HistoryStep]  # the steps beyond noise across them, every metric
    # every revision it shows -> short sha and commit subject (identity.revision_label)
    revision_labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ExperimentHistory:
    revisions: list[str]
    steps: list[HistoryStep]
    histories: list[History]  # one per metric: what the page's timelines draw


@dataclass(frozen=True)
class Page:
    """One page of a list: its items, where it starts, and how many there are in all."""

    items: list[Any]
    offset: int
    total: int


def page_bounds(limit: Any, offset: Any) -> tuple[int, int]:
    """A request's ``limit`` and ``offset`` (text or None) as numbers, checked: a limit of 1 to
    MAX_PAGE (default PAGE), an offset of 0 to 10**9; ValueError names what is wrong."""
    def number(text: Any, name: str, default: int, low: int, high: int) -> int:
        if text is None or text == "":
            return default
        if not str(text).isascii() or not str(text).isdigit() or not low <= int(text) <= high:
            raise ValueError(f"{name}={text!r}: a whole number from {low} to {high}")
        return int(text)
    return number(limit, "limit", PAGE, 1, MAX_PAGE), number(offset, "offset", 0, 0, 10**9)


def as_json(value: Any) -> Any:
    """A view (or a list of them) as JSON-ready values; times as ISO 8601 UTC."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): as_json(v) for k, v in value.items()}
    if isinstance(value, datetime):
        return value.isoformat() + "Z"
    return value
