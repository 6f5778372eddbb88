"""Board leases: what a coordinator shares with the others through the store, and its turns on
the boards.

Every coordinator (`benchfarm run`, `benchfarm serve`) has a holder id. ``Sharing`` is its side
of the store's leases (db.leases) and of its job: ``tick`` renews the leases in flight and the
job's heartbeat, and raises ``Cancelled`` once `benchfarm cancel` marked the job cancelled. The
lease time is ``--lease-ttl``, else ``$BENCHFARM_LEASE_TTL_S``, else 30 s: a dead coordinator
blocks its boards for at most that long.

``BoardTurns`` holds this coordinator's leases for the scheduler: it takes a board's lease
before each dispatch (and, while another holder has it, says so once and lets the scheduler try
again a moment later), renews the leases in flight, releases each once its result is stored,
tells whether another coordinator of the store finished a run meanwhile, and says once when a
board's lock file is held by a coordinator of another store. The scheduler owns the queues and
the boards; this owns what is shared with the others.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from db.errors import StoreError
from db.leases import Claim, LeaseInfo
from db.store import Store
from harness.errors import InputError
from harness.execution.progress import Progress

DEFAULT_LEASE_TTL_S = 30.0
# A lease shorter than MIN_LEASE_TTL_S expires between the driver's renewals (it renews at most
# once a second, and a result's handling can take that long); a day is the most, since a dead
# coordinator blocks its boards for the lease time (inf or 1e12 would block them for good).
MIN_LEASE_TTL_S = 3.0
MAX_LEASE_TTL_S = 86400.0
TTL_ENV = "BENCHFARM_LEASE_TTL_S"
LEASE_POLL_S = 0.5  # a board whose lease (or lock file) is taken is tried again this often
HEARTBEAT_MAX_S = 1.0  # the job heartbeat (and so a cancel) is seen at least this often
# while the driver is busy elsewhere (builds, planning) a thread renews the job's heartbeat at
# least this often, whatever the lease time: a job whose heartbeat is older than
# ``job_lost_after`` has lost its coordinator
JOB_HEARTBEAT_MAX_S = 5.0


class Cancelled(Exception):
    """The coordinator's job was cancelled with `benchfarm cancel`."""


class SteppedAside(Exception):
    """The coordinator's job went back to the queue for a better job (``Sharing.step_aside``):
    the reason."""


def lease_ttl(flag: float | None = None) -> float:
    """The lease time in seconds: the flag, else the environment, else the default."""
    if flag is not None:
        source, value = "--lease-ttl", str(flag)
    else:
        source, value = f"${TTL_ENV}", os.environ.get(TTL_ENV, str(DEFAULT_LEASE_TTL_S))
    try:
        ttl = float(value)
    except ValueError:
        ttl = 0.0
    if not MIN_LEASE_TTL_S <= ttl <= MAX_LEASE_TTL_S:
        raise InputError(f"{source}: {value!r} is not a lease time in seconds (between "
                         f"{MIN_LEASE_TTL_S:g} and {MAX_LEASE_TTL_S:g})")
    return ttl


def job_lost_after(ttl_s: float) -> float:
    """How old a running job's heartbeat is when its coordinator is taken for dead (`wait`
    ends such a one-shot run as lost): the lease time, and at least three missed beats."""
    return max(ttl_s, 3 * JOB_HEARTBEAT_MAX_S)


def new_holder() -> str:
    """host:pid:nonce: names the coordinator in leases and jobs, unique across restarts."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass
class Sharing:
    store: Store
    holder: str
    ttl_s: float
    experiment: str
    job_id: int | None = None
    priority: int = 0  # the job's: a board's next lease goes to the best waiter (db.leases)
    # `serve`'s (harness.lab.serving): while the job holds no board, whether it went back to
    # the queue for a better queued job that wants its boards (the reason; None: it goes on)
    step_aside: Callable[[], str | None] | None = None
    last_tick: float = 0.0
    last_aside: float = 0.0  # when step_aside was last asked (monotonic)

    def acquire(self, board: str, run_key: str | None,
                on_grant: Callable[[Connection, LeaseInfo], Any] | None = None) -> Claim:
        """The board's lease for us (``.granted``), or the one in the way (``.current``).
        Granting it also marks lost the attempts of coordinators whose leases lapsed (SIGKILL,
        a long stall): they show as lost from then on (``Store.sweep_lost``, in the same
        transaction, with ``on_grant``)."""
        return self.store.leases.acquire(board, self.holder, self.ttl_s, self.experiment,
                                         run_key, self.priority,
                                         on_grant=self._granted(on_grant))

    def hand_over(self, lease_id: str, board: str, run_key: str | None,
                  on_grant: Callable[[Connection, LeaseInfo], Any] | None = None) -> Claim:
        """``release(lease_id, again=True)`` and at once ``acquire(board, run_key)``, in one
        transaction where it can (db.leases.Leases.hand_over)."""
        return self.store.leases.hand_over(lease_id, board, self.holder, self.ttl_s,
                                           self.experiment, run_key, self.priority,
                                           on_grant=self._granted(on_grant))

    def _granted(self, then: Callable[[Connection, LeaseInfo], Any] | None
                 ) -> Callable[[Connection, LeaseInfo], Any]:
        def granted(conn: Connection, lease: LeaseInfo) -> None:
            self.store.sweep_lost(conn)
            if then is not None:
                then(conn, lease)
        return granted

    def release(self, lease_id: str, again: bool) -> None:
        """Give the board back; ``again``: we wait for it for our next run."""
        self.store.leases.release(lease_id, self.priority if again else None)

    def withdraw(self) -> None:
        """We wait for no board any more."""
        self.store.leases.withdraw(self.holder)

    def tick(self, held: list[str]) -> set[str]:
        """Renew ``held`` leases and the job's heartbeat when due; the lease ids lost. Raises
        Cancelled once the job was cancelled."""
        now = time.monotonic()
        if now - self.last_tick < min(self.ttl_s / 3, HEARTBEAT_MAX_S):
            return set()
        self.last_tick = now
        lost = self.store.leases.renew(held, self.ttl_s)
        if self.job_id is not None and self.store.jobs.heartbeat(self.job_id) == "cancelled":
            raise Cancelled(f"experiment {self.experiment} was cancelled")
        return lost

    def check_step_aside(self) -> None:
        """With nothing in flight, while the job waits for its boards: raise SteppedAside once
        it went back to the queue for a better job (asked at most every HEARTBEAT_MAX_S)."""
        now = time.monotonic()
        if self.step_aside is None or now - self.last_aside < HEARTBEAT_MAX_S:
            return
        self.last_aside = now
        why = self.step_aside()
        if why:
            raise SteppedAside(why)


@contextmanager
def job_heartbeat(store: Store, job_id: int, interval_s: float) -> Iterator[None]:
    """Heartbeat the job from a thread while the driver may be busy for long (builds, workload
    generation, planning): a job whose heartbeat stops is taken over by another `serve`."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval_s):
            try:
                store.jobs.heartbeat(job_id)
            except (StoreError, SQLAlchemyError):
                return  # the driver meets the same store error and reports it

    thread = threading.Thread(target=beat, name="benchfarm-job-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()

class BoardTurns:
    def __init__(self, sharing: Sharing, store: Store, progress: Progress) -> None:
        self.sharing = sharing
        self.store = store
        self.progress = progress
        self.leases: dict[str, str] = {}  # board -> the lease id held for its dispatch
        self._kept: set[str] = set()  # boards whose lease waits for their next run (keep)
        self._done_at_take: dict[str, bool] = {}  # run key -> done, read by the last take
        self._waiting_on: dict[str, str] = {}  # board -> who holds its lease (noted once)
        self._locked_by: dict[str, str] = {}  # board -> the lock file error noted (once)

    def take(self, board: str, run_key: str | None, done_check: bool = False,
             start: Callable[[Connection, str], Any] | None = None) -> bool:
        """Take the board's lease for one dispatch (``run_key`` None: a warm-up); False, with a
        note the first time, while another coordinator holds it. In the transaction that
        grants the lease: with ``done_check`` whether the run is done is read (for the
        ``done_elsewhere`` that follows), and unless it is, ``start(conn, lease_id)`` records
        its attempt."""
        self._done_at_take.clear()
        check = None
        if run_key is not None and (done_check or start is not None):
            def check(conn: Connection, lease: LeaseInfo) -> None:
                done = done_check and self.store.run_done(conn, run_key)
                if done_check:
                    self._done_at_take[run_key] = done
                if start is not None and not done:
                    start(conn, lease.lease_id)
        if board in self._kept:  # from the board's last run straight to this one
            self._kept.discard(board)
            claim = self.sharing.hand_over(self.leases.pop(board), board, run_key, check)
        else:
            claim = self.sharing.acquire(board, run_key, check)  # lost attempts swept too
        if claim.granted:
            self.leases[board] = claim.granted.lease_id
            self._waiting_on.pop(board, None)
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
        self._kept.discard(board)
        lease_id = self.leases.pop(board, None)
        if lease_id:
            self.sharing.release(lease_id, again)

    def keep(self, board: str) -> None:
        """The board's run is stored and the coordinator has more for it: its lease waits for
        the board's next ``take``, which hands it over in one transaction (the same outcome
        as ``release(board, again=True)`` then ``take``); ``release_kept`` releases it
        (again) if no take came."""
        if board in self.leases:
            self._kept.add(board)

    def release_kept(self, board: str) -> None:
        if board in self._kept:
            self.release(board, again=True)

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
        done = self._done_at_take.pop(run_key, None)  # read as its lease was granted
        if done is None:
            done = bool(self.store.completed_run_keys([run_key]))
        if not done:
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
