"""A board freed while serves look for work goes to the best job that waited for it: which jobs
wait and which one a serve takes are decided in one write transaction (Jobs.claim_next), so a
release cannot slip in between (it used to: a serve decided which jobs wait, then claimed, and
an idle serve took a priority-1 job right after `release` freed a priority-5 job's board). On
SQLite the store's writers are serialised; on PostgreSQL the claim locks the board states and
reservations it reads."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import pytest
from fixtures_ray import needle_spec

from db.jobs import JobInfo
from db.leases import utcnow
from db.store import Store
from devices.inventory import device_table, load_inventory
from harness.execution.coordinator import Coordinator
from harness.execution.notify import Targets
from harness.lab.serving import Service

ROUNDS = 20
BOARDS = [{"name": "arm-1", "host": "127.0.0.1", "arch": "aarch64", "class": "rk3588"},
          {"name": "x86-1", "host": "127.0.0.1", "arch": "x86_64", "class": "x86"}]


@pytest.fixture
def lab(store_url: str, tmp_path: Path, needle_model: Path):
    inventory = tmp_path / "inventory.toml"
    inventory.write_text("".join(device_table(board) for board in BOARDS))
    store = Store.open(store_url)  # SQLite, and PostgreSQL when opted in
    serves = [Service(store, load_inventory(inventory), Coordinator(), Targets(), None)
              for _ in range(2)]
    specs = {board: needle_spec(tmp_path, f"on-{board}", needle_model, [board])
             for board in ("arm-1", "x86-1")}
    yield store, serves, specs
    store.close()


def _submit(store: Store, spec: Path, priority: int) -> int:
    return store.jobs.add(spec.stem, str(spec), spec.read_text(), owner="ann",
                          priority=priority)


def _claim_all(serves: list[Service]) -> list[JobInfo | None]:
    """Both serves claim at once (threads released together)."""
    barrier = threading.Barrier(len(serves))
    claimed: list[JobInfo | None] = [None] * len(serves)

    def claim(index: int) -> None:
        barrier.wait()
        claimed[index] = serves[index].claim()

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(serves))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return claimed


def _round(store: Store, first: Service, second: Service, specs: dict[str, Path],
           round_: int) -> None:
    store.boards.reserve("arm-1", "zed", utcnow() + timedelta(hours=1), "zed's")
    best = _submit(store, specs["arm-1"], 5)  # waits: its only board is zed's
    middle = _submit(store, specs["x86-1"], 3)
    low = _submit(store, specs["x86-1"], 1)
    released = threading.Event()

    def release() -> None:
        store.boards.release("arm-1", "zed")
        released.set()

    releaser = threading.Thread(target=release)

    def waits(conn, job: JobInfo) -> str | None:
        why = first.why_waiting(conn, job)
        if job.id == best and not releaser.is_alive() and not released.is_set():
            # zed releases the board once this serve has read it reserved: the release waits
            # for the decision's transaction, it cannot land between the decision and the claim
            releaser.start()
            releaser.join(0.5)
            assert not released.is_set(), f"round {round_}: released mid-decision"
        return why

    taken = store.jobs.claim_next(first.who.holder, first.who.ttl_s, waits)
    releaser.join()
    assert taken is not None and taken.id == middle, round_  # 5 waited for zed's board
    # the board is free now: the next serve to look takes the priority-5 job, not the
    # priority-1 one
    assert second.claim().id == best, round_
    assert [e.event for e in store.jobs.events(best)] == ["submitted", "waiting",
                                                          "claimed"], round_
    # the two serves looking at once: one takes the last job, the other nothing
    claimed = _claim_all([first, second])
    assert sorted(job.id for job in claimed if job) == [low], round_
    for job in (best, middle, low):
        store.jobs.finish(job, "done", f"round {round_}")


def test_a_released_board_goes_to_the_best_waiting_job_every_time(lab) -> None:
    store, (first, second), specs = lab
    for round_ in range(ROUNDS):
        _round(store, first, second, specs, round_)
    assert store.jobs.count(("queued", "running")) == 0


def test_a_claimed_job_that_only_waits_steps_aside_for_a_better_one(lab) -> None:
    """A job claimed by a serve whose coordinator holds no board yet (it waits for the board's
    lease) goes back to the queue once a queued job of higher priority can start on one of its
    boards, and the serve's next claim takes that job: never for a job no better, one that
    wants other boards, or one that cannot start."""
    store, (first, second), specs = lab
    low = _submit(store, specs["x86-1"], 1)
    assert first.claim().id == low
    aside = first.step_aside(store.jobs.get(low))
    assert aside() is None  # nothing queued
    other = _submit(store, specs["arm-1"], 4)  # better, on another board
    _submit(store, specs["x86-1"], 1)  # on its board, no better
    store.boards.reserve("x86-1", "zed", utcnow() + timedelta(hours=1), "zed's")
    best = _submit(store, specs["x86-1"], 5)  # better, on its board, but zed's for now
    assert aside() is None
    assert store.jobs.get(low).state == "running"
    store.boards.release("x86-1", "zed")
    why = aside()
    assert why == (f"stepped aside: job {best} (priority 5) goes first on board 'x86-1', "
                   "which this job (priority 1) waits for")
    job = store.jobs.get(low)
    assert (job.state, job.holder, job.message) == ("queued", None, f"requeued: {why}")
    assert [(e.event, e.cause) for e in store.jobs.events(low)][-1] == ("requeued", why)
    assert first.claim().id == best  # its serve takes the better job
    assert second.claim().id == other
    assert aside() is None  # no longer running: nothing to step aside from
