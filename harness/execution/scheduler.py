"""The driver loop: one runner actor per board, a queue per placement, results stored as they
come.

The driver owns all state and is the only database writer. Each board has one actor that runs
one run at a time (boards are exclusive). Runs wait in one queue per placement: a device name
(pinned runs) or a device class (a pool any board of the class may serve). The driver hands the
next run to a free board, waits for any result with ``ray.wait`` and stores it at once, in one
transaction per run.

What goes wrong (boards lost or locked, runners that die, leases lost in flight, the
coordinator stopped) is handled apart, in harness.execution.faults, which the scheduler mixes
in.

Every attempt is a measurement of its own in the store, recorded as ``running`` when it is
dispatched (under the board's lease) and completed with its result; a result that comes after
its lease expired is kept but not counted (another coordinator may have had the board).

Sharing boards with other coordinators (harness.execution.leases): a board's lease is taken in
the store before each dispatch, renewed while the run is in flight and released once its result
is stored; a board leased by another coordinator, or whose lock file another coordinator's
command holds (status ``busy`` from the runner), is tried again a moment later. What the
statuses of a report mean, and who retries what: harness.contract.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter, deque
from dataclasses import replace
from datetime import UTC, datetime

import ray
from sqlalchemy import Connection

from db.records import RunResult
from db.store import Store
from devices.boardlock import LockHolder
from harness.contract import RunReport, WorkOrder
from harness.errors import interrupts_held
from harness.execution.artifacts import start_server
from harness.execution.cluster import PLACEMENT_TIMEOUT_S, wait_placed
from harness.execution.faults import FaultHandling
from harness.execution.gate import BoardGate
from harness.execution.leases import LEASE_POLL_S, BoardTurns, Cancelled, Sharing
from harness.execution.progress import Progress
from harness.execution.results import base_result, to_run_result
from harness.execution.runner import Board, Dispatch, retire, start_runner
from harness.plan.planner import Plan, PlannedRun


class Scheduler(FaultHandling):
    def __init__(self, plan: Plan, store: Store, progress: Progress, sharing: Sharing,
                 gate: BoardGate) -> None:
        self.plan = plan
        self.turns = BoardTurns(sharing, store, progress)
        self.gate = gate  # the boards' states and reservations (harness.execution.gate)
        self._held_back: dict[str, str] = {}  # board -> why it takes no new run (said once)
        self.spec = plan.spec
        self.store = store
        self.job_id = sharing.job_id  # every attempt names its job (`benchfarm logs JOB`)
        self.progress = progress
        self.queues: dict[str, deque[PlannedRun]] = {p.key: deque() for p in plan.placements}
        for run in plan.todo:
            self.queues[run.placement.key].append(run)
        # actor names: the Ray job plus this scheduler's own suffix, since one driver may run
        # several matrices in turn and ray.kill frees the previous one's names asynchronously
        self.label = f"{ray.get_runtime_context().get_job_id()}:{uuid.uuid4().hex[:8]}"
        self.server = start_server(plan.catalogue, self.label)
        self.holder = LockHolder(sharing.holder,
                                 store.database.url.render_as_string(hide_password=True),
                                 sharing.job_id, "")
        self.lost_keys: set[str] = set()  # runs whose last try was lost with its runner
        self.boards: dict[str, Board] = {}
        for placement in plan.placements:
            for name in placement.devices:
                if name not in self.boards:
                    device = plan.boards[name]
                    actor = start_runner(device, self.server, f"board:{name}:{self.label}",
                                       self.holder)
                    self.boards[name] = Board(device, actor, [])
                serves = self.boards[name].serves
                if placement.by_class:
                    serves.append(placement.key)
                else:
                    serves.insert(0, placement.key)
        # placement key -> the boards that serve it (fixed once the runners are started)
        self.servers: dict[str, list[Board]] = {key: [b for b in self.boards.values()
                                                      if key in b.serves]
                                                for key in self.queues}
        self.counts: Counter[str] = Counter()
        self._collecting: Board | None = None  # the board whose result is being stored
        progress.remaining_by = self._remaining_by

    def _remaining_by(self) -> dict[str, int]:
        remaining = {key: len(queue) for key, queue in self.queues.items()}
        for board in self.boards.values():
            if board.busy and not board.busy.warmup and board is not self._collecting:
                remaining[board.busy.run.placement.key] += 1
        return remaining

    # -- main loop ----------------------------------------------------------------------------

    def run(self) -> Counter[str]:
        try:
            wait_placed({n: b.actor for n, b in self.boards.items()}, PLACEMENT_TIMEOUT_S)
            while True:
                self._abort_lost_leases(self.turns.renew())
                self._check_starting()
                self._give_up_unservable()
                self._dispatch()
                busy = [b for b in self.boards.values() if b.busy]
                if not busy:
                    if not any(self.queues.values()):
                        break
                    # nothing in flight and no board held: a better job may take its place
                    self.turns.sharing.check_step_aside()
                    time.sleep(0.1)  # every free board is backing off
                    continue
                refs = [b.busy.ref for b in busy]
                ready, _ = ray.wait(refs, num_returns=1, timeout=1.0)
                if ready and len(refs) > 1:  # every result that is in: one pass for them all
                    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                done = set(ready)
                for board in busy:
                    if board.busy is not None and board.busy.ref in done:
                        self._abort_lost_leases(self.turns.renew())  # when due, as above
                        self._collect(board)
                        self._dispatch_board(board, time.monotonic())  # its next run at once
                        self.turns.release_kept(board.device.name)  # if that run did not start
        except KeyboardInterrupt:
            self._stop_in_flight("interrupted",
                                 "the coordinator was interrupted while this run was in flight")
            raise
        except Cancelled:
            self._stop_in_flight("cancelled", "cancelled by `benchfarm cancel` while in flight")
            raise
        finally:
            retire([board.actor for board in self.boards.values() if not board.dead])
            self.turns.done()
            ray.kill(self.server)
        return self.counts

    def _dispatch(self) -> None:
        now = time.monotonic()
        for board in self.boards.values():
            self._dispatch_board(board, now)

    def _dispatch_board(self, board: Board, now: float) -> None:
        """Start the board's next run, when it is free to take one."""
        if (board.dead or board.busy or board.starting or board.not_before > now
                or self._held_back_now(board)):
            return
        run = self._next_for(board, now)
        if run is None:
            return
        # A Ctrl-C waits for the end of this: an attempt stored as running is then on the
        # board as in flight, where stopping finds it and stores it interrupted.
        with interrupts_held():
            self._start_run(board, run, now)

    def _start_run(self, board: Board, run: PlannedRun, now: float) -> None:
        """Take the board's lease for ``run`` (its attempt stored as running in the same
        transaction) and send it to the board's runner."""
        warmup = board.warmed[run.group] < self.spec.warmups
        started: dict[str, int] = {}  # the attempt recorded as the lease was granted

        def start(conn: Connection, lease_id: str) -> None:
            started["id"] = self._start_on(conn, board, run, lease_id)

        if not self.turns.take(board.device.name, None if warmup else run.key,
                               done_check=not self.plan.force,
                               start=None if warmup else start):
            board.not_before = now + LEASE_POLL_S
            return
        if not warmup and "id" not in started:  # done elsewhere meanwhile: the next one
            run = self._first_not_done(board, run, now)
            if run is None:
                self.turns.release(board.device.name)
                return
        order: WorkOrder = replace(run.order, warmup=True) if warmup else run.order
        if not warmup:
            self._take(run)
            run.attempts += 1
            if "id" in started:
                run.measurement_id = started["id"]
            else:
                self._start(board, run)
        label = f"{board.device.name}: {'warm-up ' if warmup else ''}{order.label}"
        board.busy = Dispatch(board.actor.run.options(name=label).remote(order), run, warmup)

    def _held_back_now(self, board: Board) -> bool:
        """Whether the board's state or reservation stops new runs on it (said once)."""
        name = board.device.name
        why = self.gate.blocked(name)
        if why and self._held_back.get(name) != why:
            self.progress.note(f"{why}: no new run starts there")
        if why:
            self._held_back[name] = why
        else:
            self._held_back.pop(name, None)
        return why is not None

    def _collect(self, board: Board) -> None:
        # A Ctrl-C waits for the result to be stored and the board freed: the run is then
        # stored once, as it ended, never also as interrupted.
        with interrupts_held():
            self._collecting = board
            self._handle(board, board.busy)
            board.busy = self._collecting = None
        if not board.dead and any(self.queues[key] for key in board.serves):
            # released and taken again for its next run, in one step if that run starts now
            # (else released, waiting for it again: run's loop)
            self.turns.keep(board.device.name)
        else:
            self.turns.release(board.device.name)

    def _handle(self, board: Board, dispatch: Dispatch) -> None:
        try:
            report: RunReport = ray.get(dispatch.ref)
        except ray.exceptions.RayActorError as exc:  # the runner (or its node) died
            self._runner_lost(board, dispatch, exc)
            return
        except ray.exceptions.RayError as exc:  # the run's task failed: as a lost board
            report = RunReport(dispatch.run.key, board.device.name, "lost", datetime.now(UTC),
                               datetime.now(UTC), 0.0, error=f"runner actor failed: {exc}")
        if dispatch.aborted:  # its lease was lost: nothing to store; it waits for the board
            self._busy(board, dispatch, f"device {board.device.name!r}: the run was stopped "
                                        "on the board when its lease was lost")
            return
        if report.status == "lost":
            self._lost(board, dispatch, report.error or "lost")
            return
        if report.status == "busy":
            self._busy(board, dispatch, report.error or "busy")
            return
        board.losses = 0
        self.gate.reached(board.device.name)
        self.turns.unlocked(board.device.name)
        board.not_before = time.monotonic() + self.spec.cooldown_s
        run = dispatch.run
        if dispatch.warmup:
            board.warmed[run.group] += 1
            if report.status != "ok":
                self.progress.note(f"warm-up on {board.device.name} failed: {report.error}")
            return
        result = to_run_result(report, run, self.plan.device_ids[board.device.name],
                               self.spec.model)
        if self._save(run, result, self.turns.lease_of(board.device.name)):
            # kept as its own attempt, never the run's ok: the run goes back to its queue, and
            # is dropped there if another coordinator stored it meanwhile (_first_not_done)
            self.counts["expired"] += 1
            self.progress.note(f"device {board.device.name!r}: the result of {run.order.label} "
                               "came after its lease expired; kept as its own attempt, not "
                               "counted; the run is tried again unless another coordinator "
                               "stored it")
            self.queues[run.placement.key].appendleft(run)
            return
        self.counts[report.status] += 1
        self.progress.record(board.device.name, report.status, run.order.label)

    def _start(self, board: Board, run: PlannedRun) -> None:
        """Record the attempt in the store as it starts (status running, under the lease)."""
        record = base_result(run, self.plan.device_ids[board.device.name], "running", None)
        record.lease_id = self.turns.lease_of(board.device.name)
        record.job_id = self.job_id
        run.measurement_id = self.store.start_measurement(record, run.measurement_id)

    def _start_on(self, conn: Connection, board: Board, run: PlannedRun, lease_id: str) -> int:
        """``_start`` inside the transaction that grants the board's lease (``lease_id``): the
        attempt's id."""
        record = base_result(run, self.plan.device_ids[board.device.name], "running", None)
        record.lease_id = lease_id
        record.job_id = self.job_id
        return self.store.start_measurement_on(conn, record, run.measurement_id)

    def _save(self, run: PlannedRun, result: RunResult, lease: str | None) -> bool:
        """Complete the run's open attempt (or add one) with ``result``; True when its lease
        had expired meanwhile (the result is kept, not counted)."""
        result.lease_id = lease
        result.job_id = self.job_id
        result.finished_at = result.finished_at or datetime.now(UTC)  # when it ended
        saved = self.store.save_run(result, run.measurement_id)
        run.measurement_id = None
        return saved.lease_expired

    # -- the queues ---------------------------------------------------------------------------

    def _next_for(self, board: Board, now: float) -> PlannedRun | None:
        """The board's next run: its pinned runs first, then its classes' pools; a pooled run
        lost on this board waits for another board of the pool."""
        name = board.device.name
        for key in board.serves:
            others = any(not b.dead and b is not board for b in self.servers[key])
            for run in self.queues[key]:
                if run.not_before > now:
                    continue
                if others and name in run.lost_on:  # leave it to another board of the pool
                    continue
                return run
        return None

    def _take(self, run: PlannedRun) -> None:
        self.queues[run.placement.key].remove(run)

    def _first_not_done(self, board: Board, run: PlannedRun | None,
                        now: float) -> PlannedRun | None:
        """Under the board's lease: drop the runs another coordinator of the store finished
        meanwhile (two people running one spec run each of its runs once)."""
        while run is not None and not self.plan.force and \
                self.turns.done_elsewhere(run.key, self.plan.experiment_id):
            self._take(run)
            self.counts["elsewhere"] += 1
            self.progress.record(board.device.name, "elsewhere", run.order.label)
            run = self._next_for(board, now)
        return run

