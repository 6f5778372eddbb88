"""A small fleet of boards on this machine (``transport = "local"``) running the stand-in engine
(bench/standin.sh) through the real coordinator: what bench/fleet.py measures at 16 to 64
boards, checked for correctness at 4 (no timing is asserted)."""

from __future__ import annotations

import io
from pathlib import Path

from fixtures_ray import every_measurement

from db.store import Store
from devices.boardlock import LOCK_FILE
from devices.inventory import device_table, load_inventory
from harness.execution.coordinator import RunRequest, run_experiment
from harness.spec import load_spec

STANDIN = Path(__file__).resolve().parents[2] / "bench" / "standin.sh"
BOARDS = [f"fleet-{i}" for i in range(4)]
RUNS_PER_BOARD = 3


def test_a_fleet_of_local_boards_runs_each_run_once(ray_address: str, needle_model: Path,
                                                    tmp_path: Path) -> None:
    inventory = tmp_path / "fleet.toml"
    inventory.write_text("".join(device_table({
        "name": name, "transport": "local", "class": "fleet",
        "workdir": str(tmp_path / name), "exec_prefix": ["sh", str(STANDIN), "0.2"]})
        for name in BOARDS))
    spec = tmp_path / "fleet-spec.toml"
    spec.write_text(f'name = "fleet"\nmodel = "{needle_model}"\ndevices = ["fleet"]\n'
                    f"repeats = {len(BOARDS) * RUNS_PER_BOARD}\nwarmups = 0\n"
                    "[engine.policy.exact]\n"
                    '[[workload]]\nkind = "needle"\nctx = 128\ndepth = 0.5\nseed = 0\n'
                    "max_new = 2\n")
    store = Store.open(f"sqlite:///{tmp_path}/fleet.db")
    summary = run_experiment(RunRequest(load_spec(spec), load_inventory(inventory),
                                        stream=io.StringIO()), store)
    total = len(BOARDS) * RUNS_PER_BOARD
    assert summary.succeeded and (summary.total, summary.counts["ok"]) == (total, total), \
        summary.line()

    attempts = every_measurement(store, "fleet")
    # every run stored ok, exactly once: one attempt each, no retry, no lost or expired one
    assert len(attempts) == total and attempts["run_key"].is_unique
    assert set(attempts["status"]) == {"ok"} and not attempts["lease_expired"].any()
    # a pool of the class: every board got runs, and ran them under its own lock file
    assert set(attempts["device_name"]) == set(BOARDS)
    for name in BOARDS:
        assert (tmp_path / name / LOCK_FILE).is_file()
    assert (attempts["engine_ms"] >= 150).all()  # the stand-in ran (and slept) every time
    assert store.leases.active() == []
    assert store.jobs.get(summary.job_id).state == "done"
