"""The scheduler's fault handling, apart from its queue loop (harness.execution.scheduler).

A board that is lost (connection refused, dropped, transfer failed) gets its run back in the
queue, with exponential backoff, up to ``retries`` more tries; a pooled run goes to another
board of its class meanwhile. A board lost more than ``retries`` times in a row is given up, and
runs that no remaining board can serve are stored as pending for a later `benchfarm run`. A
board whose lock file another coordinator holds ran nothing: its run waits for it, without
counting a try.

Ctrl-C (and SIGTERM) stores the in-flight runs as interrupted before the actors go;
`benchfarm cancel` stores them as cancelled; either way each board's runner first kills the
run's session on the board (``DeviceRunner.abort``), and so does a lease lost in flight.

A runner actor that dies (its node was lost, or it crashed) takes nothing else down: its run in
flight is stored ``lost`` and queued again, and a new runner (a new name: the old one's may
still be registered) is started for the board. Until it is placed the board is skipped; once
no live node of the cluster can place it, the board is given up: the rest finishes, the board's
lost run stays ``lost`` and its other runs are stored pending, for a later `benchfarm run`.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from typing import Any

import ray

from db.records import RunResult
from devices.boardlock import LockHolder
from harness.execution.cluster import PLACEMENT_TIMEOUT_S, placeable
from harness.execution.gate import BoardGate
from harness.execution.leases import LEASE_POLL_S, BoardTurns
from harness.execution.progress import Progress
from harness.execution.results import base_result
from harness.execution.runner import Board, Dispatch, retire, start_runner
from harness.plan.planner import Plan, PlannedRun
from harness.spec import Spec

ABORT_WAIT_S = 20.0  # how long a stopping coordinator waits for its boards' runs to be killed


class FaultHandling:
    """What the scheduler does when a board, its runner, its lease or the coordinator fails.
    The scheduler is the one class that mixes it in: these are its attributes and its
    ``_save`` and ``_held_back_now``, which the methods below use."""

    plan: Plan
    spec: Spec
    turns: BoardTurns
    gate: BoardGate
    progress: Progress
    queues: dict[str, deque[PlannedRun]]
    boards: dict[str, Board]
    servers: dict[str, list[Board]]  # placement key -> the boards that serve it
    counts: Counter[str]
    lost_keys: set[str]  # runs whose last try was lost with its runner
    server: Any  # the artifact server the runners fetch from
    label: str  # the runners' name suffix
    holder: LockHolder
    _held_back: dict[str, str]

    def _save(self, run: PlannedRun, result: RunResult, lease: str | None) -> bool:
        raise NotImplementedError

    def _held_back_now(self, board: Board) -> bool:
        raise NotImplementedError

    # -- boards lost, or locked by another coordinator ----------------------------------------

    def _lost(self, board: Board, dispatch: Dispatch, error: str) -> None:
        name = board.device.name
        board.losses += 1
        board.last_error = error
        self.gate.lost(name, error)
        backoff = self.spec.backoff_s * 2 ** (board.losses - 1)
        board.not_before = time.monotonic() + backoff
        retries = self.spec.retries
        run = dispatch.run
        if not dispatch.warmup:
            run.lost_on.add(name)
            if run.attempts > retries:
                self._placeholder([run], "pending", name,
                                  f"gave up after {run.attempts} tries: {error}")
            else:
                self._save(run, base_result(run, self.plan.device_ids[name], "lost", error),
                           self.turns.lease_of(name))
                # A pinned run waits for its board; a pooled one may go to another board now.
                run.not_before = 0.0 if run.placement.by_class else board.not_before
                self.queues[run.placement.key].appendleft(run)
        if board.losses > retries:
            board.dead = True
            retire([board.actor])
            self.progress.note(f"device {name!r} given up after {board.losses} failed tries: "
                               f"{error}")
        else:
            self.progress.note(f"device {name!r} lost ({error}); retry {board.losses} of "
                               f"{retries} in {backoff:g}s")

    def _busy(self, board: Board, dispatch: Dispatch, error: str) -> None:
        """The board's lock file was taken: nothing ran; the run waits for the board."""
        board.not_before = time.monotonic() + LEASE_POLL_S
        if not dispatch.warmup:
            dispatch.run.attempts -= 1
            self.queues[dispatch.run.placement.key].appendleft(dispatch.run)
        self.turns.note_locked(board.device.name, error)

    def _give_up_unservable(self) -> None:
        """Runs whose placement has no live board left become pending (those lost with their
        runner stay lost)."""
        for key, queue in self.queues.items():
            if not queue:
                continue
            servers = self.servers[key]
            if any(not b.dead and (b.busy or not self._held_back_now(b)) for b in servers):
                continue
            errors = "; ".join(sorted({self._held_back.get(b.device.name) or b.last_error
                                       for b in servers}))
            device = servers[0].device.name
            lost = [r for r in queue if r.key in self.lost_keys]
            self._placeholder(lost, "lost", device, f"{errors}; no board of {key} left to "
                                                    "retry it")
            self._placeholder([r for r in queue if r.key not in self.lost_keys], "pending",
                              device, f"no board of {key} left to run it ({errors})")
            queue.clear()

    def _placeholder(self, runs: list[PlannedRun], status: str, device: str,
                     error: str, lease: str | None = None, count: bool = True) -> None:
        """Record runs that did not finish: their open attempt completed with ``status``, else
        an attempt of that status added (earlier measurements stay as they are). ``count``:
        whether the run ends here (a lost run queued again does not)."""
        for run in runs:
            self._save(run, base_result(run, self.plan.device_ids[device], status, error), lease)
            if count:
                self.counts[status] += 1
                self.progress.record(device, status, run.order.label)


    # -- stopping -----------------------------------------------------------------------------

    def _stop_in_flight(self, status: str, error: str) -> None:
        """Kill the runs in flight on their boards, and store them with ``status``."""
        in_flight = [b for b in self.boards.values() if b.busy]
        aborts = [b.actor.abort.remote(b.busy.run.key) for b in in_flight]
        for board in in_flight:
            if not board.busy.warmup:
                self._placeholder([board.busy.run], status, board.device.name, error,
                                  self.turns.lease_of(board.device.name))
        ray.wait(aborts, num_returns=len(aborts), timeout=ABORT_WAIT_S)

    def _abort_lost_leases(self, boards: set[str]) -> None:
        """A lease lost in flight: the run is killed on the board (another coordinator may
        have it now); its result is not stored and the run waits for the board again."""
        for name in boards:
            board = self.boards[name]
            if board.busy and not board.busy.aborted:
                board.busy.aborted = True
                board.actor.abort.remote(board.busy.run.key)


    # -- runners that die ---------------------------------------------------------------------

    def _runner_lost(self, board: Board, dispatch: Dispatch, exc: Exception) -> None:
        """The board's runner died with a run in flight: the run is stored lost and queued
        again, and a new runner is started (placed when a node can host it)."""
        name = board.device.name
        error = f"device {name!r}: its runner was lost (its node died?): {type(exc).__name__}"
        board.last_error = error
        run = dispatch.run
        if not dispatch.warmup:
            self._placeholder([run], "lost", name, error, self.turns.lease_of(name), count=False)
            self.lost_keys.add(run.key)
            run.lost_on.add(name)
            self.queues[run.placement.key].appendleft(run)
        ray.kill(board.actor)
        board.generation += 1
        board.actor = start_runner(board.device, self.server,
                                 f"board:{name}:{self.label}:{board.generation}", self.holder)
        board.starting, board.starting_since = board.actor.__ray_ready__.remote(), \
            time.monotonic()
        self.progress.note(f"{error}; waiting for a node that can run it")

    def _check_starting(self) -> None:
        """Boards whose new runner was placed are used again; those that no live node can
        place (or that were not placed in time) are given up."""
        for board in self.boards.values():
            if board.starting is None:
                continue
            ready, _ = ray.wait([board.starting], timeout=0)
            try:
                if ready:
                    ray.get(ready[0])
                    board.starting = None
                    continue
            except ray.exceptions.RayError as exc:
                board.last_error = f"{board.last_error}; a new runner failed: {exc}"
            else:
                waited = time.monotonic() - board.starting_since
                if placeable(board.device) and waited < PLACEMENT_TIMEOUT_S:
                    continue
            board.starting, board.dead = None, True
            ray.kill(board.actor)
            self.progress.note(f"device {board.device.name!r} given up: no live node of the "
                               "cluster can run it now; run again once its node is back")
