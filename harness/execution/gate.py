"""Which boards a job may start work on now: the board's state and its reservation.

A board takes new work only while it is ``online`` and not reserved for another owner
(db.boards). The scheduler asks before each dispatch (the answer is refreshed from the store
every second, so a state set while a coordinator runs takes effect without a restart; the run
in flight finishes: maintenance drains). It also reports each lost run, and a board that loses
``bad_after`` runs in a row is set ``bad`` (and announced through the job's notification
targets); a run that reached the engine resets the count.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

from db.boards import ONLINE, BoardStatus, ReservationInfo
from db.store import Store
from harness.errors import InputError
from harness.execution.notify import Targets, announce

BAD_AFTER_ENV = "BENCHFARM_BAD_AFTER"
DEFAULT_BAD_AFTER = 3
REFRESH_S = 1.0


def bad_after(flag: int | None = None) -> int:
    """How many runs lost in a row make a board bad: the flag, else the environment, else 3."""
    value = str(flag) if flag is not None else os.environ.get(BAD_AFTER_ENV,
                                                              str(DEFAULT_BAD_AFTER))
    if not value.isdigit() or int(value) < 1:
        raise InputError(f"${BAD_AFTER_ENV} / --bad-after: {value!r} is not a whole number >= 1")
    return int(value)


def why_blocked(status: BoardStatus, reservation: ReservationInfo | None,
                owner: str) -> str | None:
    """Why ``owner``'s work may not start on the board now (None: it may)."""
    if status.state != ONLINE:
        return f"board {status.board!r} is {status.state}" + (
            f" ({status.reason})" if status.reason else "")
    if reservation is not None and reservation.owner != owner:
        return (f"board {status.board!r} is reserved by {reservation.owner} until "
                f"{reservation.ends:%Y-%m-%d %H:%M} UTC"
                + (f" ({reservation.reason})" if reservation.reason else ""))
    return None


def blocked_boards(store: Store, boards: Iterable[str], owner: str,
                   conn: Any = None) -> dict[str, str]:
    """The boards that may not take ``owner``'s work now, with the reason (read on ``conn``
    when given: inside the caller's transaction)."""
    names = sorted(set(boards))
    states = store.boards.states(names, conn)
    reservations = store.boards.reservations(names, conn)
    reasons = {name: why_blocked(states[name], reservations.get(name), owner)
               for name in names}
    return {name: why for name, why in reasons.items() if why}


class BoardGate:
    """The boards' states and reservations as one coordinator's job sees them."""

    def __init__(self, store: Store, boards: Iterable[str], owner: str, holder: str,
                 targets: Targets, bad_after_runs: int | None = None) -> None:
        self.store = store
        self.boards = sorted(set(boards))
        self.owner = owner
        self.holder = holder
        self.targets = targets
        self.bad_after = bad_after(bad_after_runs)
        self._blocked: dict[str, str] = {}
        self._read_at = float("-inf")
        self._failing: set[str] = {name for name, status in store.boards.states(
            self.boards).items() if status.failures}

    def blocked(self, board: str) -> str | None:
        """Why the board may not take new work now (None: it may)."""
        now = time.monotonic()
        if now - self._read_at >= REFRESH_S:
            self._blocked = blocked_boards(self.store, self.boards, self.owner)
            self._read_at = now
        return self._blocked.get(board)

    def lost(self, board: str, error: str) -> None:
        """A run was lost on the board (an infrastructure failure)."""
        self._failing.add(board)
        if self.store.boards.record_failure(board, error, self.holder, self.bad_after):
            self._read_at = float("-inf")
            went_bad(self.store, board, self.targets)

    def reached(self, board: str) -> None:
        """A run reached the engine on the board: its lost runs no longer count."""
        if board in self._failing:
            self._failing.discard(board)
            self.store.boards.clear_failures(board)


def went_bad(store: Store, board: str, targets: Targets) -> None:
    """Announce that a board was set bad."""
    status = store.boards.states([board])[board]
    announce({"event": "board-bad", "board": board, "state": status.state,
            "reason": status.reason, "changed_by": status.changed_by,
            "at": f"{status.since:%Y-%m-%dT%H:%M:%SZ}" if status.since else None}, targets)
