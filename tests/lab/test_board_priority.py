"""Priority at the board: two coordinators of one store want the same board; once the job of
priority 5 has had a turn, every run of it goes before any later run of the priority-1 job (the
board's next lease goes to the best waiter, db.leases), and then the priority-1 job finishes.
The coordinators are two real schedulers on the session's Ray, each with a store of its own."""

from __future__ import annotations

import io
import threading
from pathlib import Path

from fixtures_ray import needle_spec, slow_local_board, stored_runs

from db.store import Store
from devices.inventory import load_inventory
from harness.execution.coordinator import Coordinator, RunRequest, RunSummary, run_experiment
from harness.spec import load_spec


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
