"""Taking turns on the boards with the other coordinators of the store.

``BoardTurns`` holds this coordinator's leases: it takes a board's lease before each dispatch
(and, while another holder has it, says so once and lets the scheduler try again a moment
later), renews the leases in flight, releases each once its result is stored, tells whether
another coordinator of the store finished a run meanwhile, and says once when a board's lock
file is held by a coordinator of another store. The scheduler owns the queues and the boards;
this owns what is shared with the others (harness.execution.sharing: the store's leases).
"""

from __future__ import annotations

from db.store import Store
from harness.execution.progress import Progress
from harness.execution.sharing import Sharing


class BoardTurns:
    def __init__(self, sharing: Sharing, store: Store, progress: Progress) -> None:
        self.sharing = sharing
        self.store = store
        self.progress = progress
        self.leases: dict[str, str] = {}  # board -> the lease id held for its dispatch
        self._waiting_on: dict[str, str] = {}  # board -> who holds its lease (noted once)
        self._locked_by: dict[str, str] = {}  # board -> the lock file error noted (once)

    def take(self, board: str, run_key: str | None) -> bool:
        """Take the board's lease for one dispatch (``run_key`` None: a warm-up); False, with a
        note the first time, while another coordinator holds it."""
        claim = self.sharing.acquire(board, run_key)
        if claim.granted:
            self.leases[board] = claim.granted.lease_id
            self._waiting_on.pop(board, None)
            # the attempts of a coordinator whose leases lapsed (SIGKILL, a long stall) show
            # as lost from now on
            self.store.mark_lost()
            return True
        lease = claim.current
        if lease and lease.holder != self.sharing.holder and \
                self._waiting_on.get(board) != lease.holder:
            self._waiting_on[board] = lease.holder
            self.progress.note(f"device {board!r} is leased by {lease.holder} "
                               f"(experiment {lease.experiment}) until {lease.expires:%H:%M:%S} "
                               "UTC; waiting")
        return False

    def lease_of(self, board: str) -> str | None:
        return self.leases.get(board)

    def release(self, board: str, again: bool = False) -> None:
        """Give the board's lease back; ``again``: this coordinator has more for it and waits
        for its next turn (a higher-priority job keeps the board, equals alternate)."""
        lease_id = self.leases.pop(board, None)
        if lease_id:
            self.sharing.release(lease_id, again)

    def done(self) -> None:
        """Every lease back, and no more waiting for any board."""
        for board in list(self.leases):
            self.release(board)
        self.sharing.withdraw()

    def renew(self) -> set[str]:
        """Renew the leases in flight (and the job's heartbeat) when due; the boards whose
        lease was lost. Raises Cancelled once the job was cancelled."""
        by_lease = {lease_id: board for board, lease_id in self.leases.items()}
        lost = {by_lease[lease_id] for lease_id in self.sharing.tick(list(by_lease))}
        for board in sorted(lost):
            self.progress.note(f"device {board!r}: its lease expired while a run was in flight "
                               "(was the coordinator stalled for longer than the lease time?); "
                               "the run is stopped on the board, another coordinator may use "
                               "it")
        return lost

    def done_elsewhere(self, run_key: str, experiment_id: int) -> bool:
        """Whether another coordinator of the store stored this run as ok meanwhile (it then
        becomes this experiment's too): two people running one spec run each of its runs
        once."""
        if not self.store.completed_run_keys([run_key]):
            return False
        self.store.link_runs(experiment_id, [run_key])
        return True

    def note_locked(self, board: str, error: str) -> None:
        """The board's lock file was taken by another coordinator: said once per holder."""
        if self._locked_by.get(board) != error:
            self._locked_by[board] = error
            self.progress.note(f"{error}; waiting")

    def unlocked(self, board: str) -> None:
        self._locked_by.pop(board, None)
