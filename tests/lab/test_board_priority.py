"""Priority at the board: two coordinators of one store want the same board; once the job of
priority 5 has had a turn, every run of it goes before any later run of the priority-1 job (the
board's next lease goes to the best waiter, db.leases), and then the priority-1 job finishes.
The coordinators are two real schedulers on the session's Ray, each with a store of its own.

And two real `benchfarm serve`s whose claimed jobs wait for a board someone holds: a job of
higher priority submitted later gets the board first once it is freed (a claimed job that
holds no board steps aside for it, harness.lab.serving), then the others in priority order."""

from __future__ import annotations

import io
import threading
import time
from datetime import timedelta
from pathlib import Path

from fixtures_ray import needle_spec, slow_local_board, start_cli, stored_runs
from sqlalchemy import select

from db.leases import WAITER_S, utcnow
from db.store import Store
from devices.inventory import load_inventory
from harness.execution.coordinator import Coordinator, RunRequest, RunSummary, run_experiment
from harness.spec import load_spec
from reports.baseline import cells_of_groups, failures


class CoordinatorThread(threading.Thread):
    """One coordinator running its job (of ``priority``) to the end."""

    def __init__(self, url: str, spec: Path, inventory: Path, priority: int) -> None:
        super().__init__(daemon=True)
        self.url, self.spec, self.inventory = url, load_spec(spec), load_inventory(inventory)
        self.who = Coordinator()
        with Store.open(url) as store:
            self.job = store.jobs.add(self.spec.name, str(spec), self.spec.text, owner="test",
                                      priority=priority, holder=self.who.holder)
        self.summary: RunSummary | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Store.open(self.url) as store:
                self.summary = run_experiment(RunRequest(
                    self.spec, self.inventory, stream=io.StringIO(), coordinator=self.who,
                    job_id=self.job), store)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def test_the_higher_priority_job_keeps_the_board_once_it_had_a_turn(
        ray_address: str, needle_model: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/prio.db"
    store = Store.open(url)
    inventory = slow_local_board(tmp_path, 1.0)  # the priority-1 job outlasts the other's start
    low = CoordinatorThread(url, needle_spec(tmp_path, "prio-low", needle_model, ["local"],
                                             depths=(0.1, 0.3, 0.5, 0.7)), inventory, 1)
    high = CoordinatorThread(url, needle_spec(tmp_path, "prio-high", needle_model, ["local"],
                                              depths=(0.6, 0.9)), inventory, 5)
    # started together (a coordinator takes seconds to plan and place its runners): whichever
    # has the board first, the other comes while it has most of its runs to go
    low.start()
    high.start()
    low.join(300)
    high.join(300)
    assert low.error is None and high.error is None, (low.error, high.error)
    assert low.summary.counts["ok"] == 8 and high.summary.counts["ok"] == 4
    lows, highs = stored_runs(store, "prio-low"), stored_runs(store, "prio-high")
    store.close()
    first_high, last_high = highs["started_at"].min(), highs["finished_at"].max()
    later_lows = lows[lows["started_at"] > first_high]
    assert (later_lows["started_at"] >= last_high).all(), (lows[["started_at"]], highs)
    # the priority-1 job had runs left when the priority-5 one had its first: they ran after it
    assert len(later_lows) >= 2, (lows[["started_at", "finished_at"]], highs[["started_at"]])


def waiting_for(store: Store, board: str) -> set[str]:
    """The holders waiting for ``board`` now (fresh waiters: db.leases)."""
    table = store.leases.waiters
    with store.database.connect() as conn:
        return set(conn.scalars(select(table.c.holder).where(
            table.c.board == board, table.c.seen >= utcnow() - timedelta(seconds=WAITER_S))))


def wait_until(predicate, what: str, timeout: float = 240) -> None:
    """Poll ``predicate`` until it holds (a timeout is a stuck serve: the test fails)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_later_better_job_gets_the_board_before_jobs_claimed_earlier(
        ray_address: str, needle_model: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/serves.db"
    store = Store.open(url)
    inventory = str(slow_local_board(tmp_path, 0.1))
    # the test holds the board: the jobs claimed first can only wait for it
    held = store.leases.acquire("local", "the-test", 3600.0).granted
    depths = {"sv-low": (0.1, 0.3), "sv-mid": (0.5, 0.7), "sv-high": (0.2, 0.8)}
    specs = {name: needle_spec(tmp_path, name, needle_model, ["local"], depths=d)
             for name, d in depths.items()}

    def submit(name: str, priority: int) -> int:
        spec = specs[name]
        return store.jobs.add(name, str(spec), spec.read_text(), owner="ann", priority=priority)

    def waits(job_id: int) -> bool:
        job = store.jobs.get(job_id)
        return job.state == "running" and job.holder in waiting_for(store, "local")

    low, mid = submit("sv-low", 1), submit("sv-mid", 3)
    serves = [start_cli(["--db", url, "serve", "--ray-address", ray_address, "--poll", "0.2",
                         "--until-idle", "--inventory", inventory], tmp_path) for _ in range(2)]
    try:
        wait_until(lambda: waits(low) and waits(mid), "both serves' jobs to wait for the board")
        high = submit("sv-high", 5)
        # one of them steps aside and its serve takes the priority-5 job, which waits too
        wait_until(lambda: waits(high), "the priority-5 job to wait for the board")
        store.leases.release(held.lease_id)
        outcomes = [serve.communicate(timeout=600) for serve in serves]
    finally:
        for serve in serves:
            if serve.poll() is None:
                serve.kill()
    for serve, (_, err) in zip(serves, outcomes, strict=True):
        assert serve.returncode == 0, err[-3000:]
    assert {store.jobs.get(j).state for j in (low, mid, high)} == {"done"}
    runs = {name: stored_runs(store, name) for name in depths}
    assert all(len(r) == 4 and set(r["status"]) == {"ok"} for r in runs.values()), runs
    # the board went to the jobs in priority order, whole: high, then mid, then low
    for first, then in (("sv-high", "sv-mid"), ("sv-mid", "sv-low")):
        assert runs[then]["started_at"].min() >= runs[first]["finished_at"].max(), (
            runs[first][["started_at", "finished_at"]], runs[then][["started_at"]])
    causes = [e.cause or "" for e in store.jobs.events(low) if e.event == "requeued"]
    assert any(c.startswith("stepped aside: job ") for c in causes), store.jobs.events(low)
    # each job's end kept whether its exact baseline fails, for `status`'s list (none read it
    # yet), as `status EXPERIMENT` finds it from the runs
    kept = {line.name: line.baseline for line in store.experiment_lines()}
    assert kept == {name: "; ".join(failures(cells_of_groups(
        store.experiment_summary(name).groups))) for name in depths}
    store.close()
