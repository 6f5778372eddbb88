"""Board turns for the scheduler: leases in the store and the board's lock file.

``BoardTurns`` is the part of ``harness.scheduler.Scheduler`` that deals with the other
coordinators: it takes a board's lease before each dispatch (and waits, with one note, while
another holder has it), renews the leases in flight, releases each once its result is stored,
skips runs another coordinator of the store finished meanwhile, and puts back a run whose
command found the board's lock file taken. It also picks a board's next run (``_next_for``).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from typing import TYPE_CHECKING

from db.store import Store
from harness.plan import Plan, PlannedRun
from harness.progress import Progress
from harness.sharing import LEASE_POLL_S, Sharing

if TYPE_CHECKING:
    from harness.scheduler import Board, Dispatch


class BoardTurns:
    plan: Plan
    store: Store
    progress: Progress
    sharing: Sharing
    boards: dict[str, Board]
    queues: dict[str, deque[PlannedRun]]
    counts: Counter[str]

    def _next_for(self, board: Board, now: float) -> PlannedRun | None:
        name = board.device.name
        for key in board.serves:
            others = any(not b.dead and b is not board and key in b.serves
                         for b in self.boards.values())
            for run in self.queues[key]:
                if run.not_before > now:
                    continue
                if others and name in run.lost_on:  # leave it to another board of the pool
                    continue
                return run
        return None

    def _take(self, run: PlannedRun) -> None:
        self.queues[run.placement.key].remove(run)

    def _renew(self) -> None:
        held = {b.lease: b for b in self.boards.values() if b.lease}
        for lease_id in self.sharing.tick(list(held)):
            self.progress.note(f"device {held[lease_id].device.name!r}: its lease expired "
                               "while a run was in flight (was the coordinator stalled for "
                               "longer than the lease time?); another coordinator may use it")

    def _release(self, board: Board) -> None:
        if board.lease:
            self.sharing.release(board.lease)
            board.lease = None

    def _lease(self, board: Board, run: PlannedRun, warmup: bool, now: float) -> bool:
        """Take the board's lease for this dispatch; False (and a note) when another holds it."""
        claim = self.sharing.acquire(board.device.name, None if warmup else run.key)
        if claim.granted:
            board.lease, board.waiting_on = claim.granted.lease_id, ""
            return True
        board.not_before = now + LEASE_POLL_S
        lease = claim.current
        if lease and lease.holder != self.sharing.holder and board.waiting_on != lease.holder:
            board.waiting_on = lease.holder
            self.progress.note(f"device {board.device.name!r} is leased by {lease.holder} "
                               f"(experiment {lease.experiment}) until {lease.expires:%H:%M:%S} "
                               "UTC; waiting")
        return False

    def _first_not_done(self, board: Board, run: PlannedRun | None,
                        now: float) -> PlannedRun | None:
        """Under the board's lease: drop the runs another coordinator of the store finished
        meanwhile (two people running one spec run each of its runs once)."""
        while run is not None and not self.plan.force and \
                self.store.completed_run_keys([run.key]):
            self._take(run)
            self.store.link_runs(self.plan.experiment_id, [run.key])
            self.counts["elsewhere"] += 1
            self.progress.record(board.device.name, "elsewhere", run.job.label)
            run = self._next_for(board, now)
        return run

    def _busy(self, board: Board, dispatch: Dispatch, error: str) -> None:
        """The board's lock file was taken: nothing ran; the run waits for the board."""
        board.not_before = time.monotonic() + LEASE_POLL_S
        if not dispatch.warmup:
            dispatch.run.attempts -= 1
            self.queues[dispatch.run.placement.key].appendleft(dispatch.run)
        if board.locked_by != error:
            board.locked_by = error
            self.progress.note(f"{error}; waiting")
