"""Board loss in the middle of a matrix: a farm node's sshd (and its sessions) SIGKILLed."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from fixtures_ray import CoordFarm, every_measurement, needle_spec, stored_runs

from db.store import Store
from devices.farm import stop_node
from devices.inventory import load_inventory
from harness.execution.coordinator import RunRequest, run_experiment
from harness.spec import load_spec

FAULT_SETTINGS = "cooldown_s = 0.5\nretries = 1\nbackoff_s = 0.2"


class NodeKiller(threading.Thread):
    """SIGKILLs a farm node's sshd and sessions once ``after`` of its runs are stored as ok."""

    def __init__(self, farm: CoordFarm, node: str, store: Store, experiment: str, after: int):
        super().__init__(daemon=True)
        self.farm, self.node, self.store = farm, node, store
        self.experiment, self.after = experiment, after
        self.killed: list[int] = []

    def ok_on_node(self) -> int:
        runs = stored_runs(self.store, self.experiment)
        if runs.empty:
            return 0
        return int(((runs["status"] == "ok") & (runs["device_name"] == self.node)).sum())

    def run(self) -> None:
        deadline = time.monotonic() + 300
        while self.ok_on_node() < self.after and time.monotonic() < deadline:
            time.sleep(0.05)
        self.killed = stop_node(self.farm.state, self.node, signal.SIGKILL)


def test_pinned_board_lost_mid_matrix_then_rerun_completes(
        ray_address: str, coord_farm: CoordFarm, needle_model: Path, tmp_path: Path) -> None:
    spec = load_spec(needle_spec(tmp_path, "lost-pinned", needle_model, ["farm-x86"],
                                 depths=(0.1, 0.4, 0.7), extra=FAULT_SETTINGS))
    store = Store.open(f"sqlite:///{tmp_path}/lost.db")
    killer = NodeKiller(coord_farm, "farm-x86", store, "lost-pinned", after=2)
    killer.start()
    try:
        summary = run_experiment(RunRequest(spec, load_inventory(coord_farm.inventory)), store)
        killer.join()
        assert killer.killed, "the node was not killed"
        runs = stored_runs(store, "lost-pinned")
        assert len(runs) == 6 and runs["run_key"].is_unique
        ok = runs[runs["status"] == "ok"]
        pending = runs[runs["status"] == "pending"]
        assert len(ok) >= 2 and len(ok) + len(pending) == 6 and len(pending) >= 1
        assert summary.counts["pending"] == len(pending) and not summary.complete
        tries = every_measurement(store, "lost-pinned")
        assert tries.groupby("run_key").size().max() == 2  # the run in flight was retried once
        assert set(tries["status"]) <= {"ok", "lost", "pending"} and "lost" in set(tries["status"])
        assert all("farm-x86" in e for e in pending["error"])
    finally:
        coord_farm.restart()

    rerun = run_experiment(RunRequest(spec, load_inventory(coord_farm.inventory)), store)
    assert rerun.skipped == len(ok) and rerun.counts["ok"] == len(pending)
    final = stored_runs(store, "lost-pinned")
    store.close()
    assert len(final) == 6 and final["run_key"].is_unique and set(final["status"]) == {"ok"}


def test_pooled_runs_move_to_another_board_of_the_class(
        ray_address: str, coord_farm: CoordFarm, needle_model: Path, tmp_path: Path) -> None:
    spec = load_spec(needle_spec(tmp_path, "lost-pool", needle_model, ["x86"],
                                 depths=(0.1, 0.3, 0.5, 0.7), extra=FAULT_SETTINGS))
    store = Store.open(f"sqlite:///{tmp_path}/pool.db")
    killer = NodeKiller(coord_farm, "farm-x86", store, "lost-pool", after=1)
    killer.start()
    try:
        summary = run_experiment(RunRequest(spec, load_inventory(coord_farm.pool_inventory)), store)
        killer.join()
        assert killer.killed
    finally:
        coord_farm.restart()
    assert summary.counts["ok"] == 8 and summary.complete
    runs = stored_runs(store, "lost-pool")
    tries = every_measurement(store, "lost-pool")
    store.close()
    assert len(runs) == 8 and runs["run_key"].is_unique and set(runs["status"]) == {"ok"}
    # a run lost on farm-x86 keeps that attempt, and its ok one ran on local
    retried = tries.groupby("run_key").filter(lambda m: len(m) > 1)
    assert set(retried.loc[retried["status"] == "lost", "device_name"]) == {"farm-x86"}
    moved = runs[runs["run_key"].isin(retried["run_key"])]
    assert len(moved) >= 1 and set(moved["device_name"]) == {"local"}
    assert set(runs["device_name"]) == {"local", "farm-x86"}
