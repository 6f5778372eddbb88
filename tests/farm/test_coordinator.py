"""The coordinator end to end: real Ray, real farm nodes over SSH, the real engine and model,
a real SQLite store. Resume, --force, engine failures, and a SIGKILLed coordinator."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import tempfile
from contextlib import closing
from pathlib import Path

import pandas as pd
import pytest
from fixtures_ray import (
    CoordFarm,
    as_measured,
    every_measurement,
    needle_spec,
    slow_local_board,
    start_cli,
    stored_runs,
    wait_for_ok_runs,
    wait_until,
    watch_stderr,
)

from db.store import Store
from devices.conditions import snapshot_flags
from devices.inventory import load_inventory
from harness.cli import main
from harness.errors import InputError
from harness.execution.coordinator import RunRequest, run_experiment
from harness.spec import load_spec
from harness.workloads import answer_text, check_answer


def credential_folders() -> set[Path]:
    """The private folders board runners on this machine copy SSH keys into
    (harness.execution.credentials)."""
    return set(Path(tempfile.gettempdir()).glob("benchfarm-farm-*"))


def test_small_matrix_on_both_farm_nodes(ray_address: str, coord_farm: CoordFarm,
                                         needle_model: Path, tmp_path: Path) -> None:
    spec = load_spec(needle_spec(tmp_path, "both-nodes", needle_model,
                                 ["farm-x86", "farm-arm"], depths=(0.2, 0.8)))
    inventory = load_inventory(coord_farm.inventory)
    store = Store.open(f"sqlite:///{tmp_path}/farm.db")
    before = credential_folders()
    summary = run_experiment(RunRequest(spec, inventory), store)
    assert (summary.total, summary.skipped, summary.counts["ok"]) == (8, 0, 8), summary
    # the two runners' copies of the boards' private keys are gone with the runners
    assert credential_folders() - before == set()

    runs = stored_runs(store, "both-nodes")
    assert len(runs) == 8 and runs["run_key"].is_unique
    assert set(runs["status"]) == {"ok"}
    assert runs.groupby("device_name").size().to_dict() == {"farm-arm": 4, "farm-x86": 4}
    # each node ran the engine built for its own architecture
    assert dict(zip(runs["device_name"], runs["build_target"], strict=True)) == \
        {"farm-arm": "aarch64", "farm-x86": "x86_64"}
    assert runs.loc[runs["device_name"] == "farm-arm", "device_emulated"].all()
    assert (runs["exit_code"] == 0).all()
    assert (runs["overhead_ms"] > 0).all() and (runs["engine_ms"] > 0).all()
    assert (runs["prompt_tokens"] > 100).all()

    frames = store.frames("both-nodes")
    timings = frames["token_timings"].groupby("measurement_id").size()
    assert (timings >= 1).all() and len(timings) == 8
    snapshots = frames["snapshots"].groupby("measurement_id")["phase"].apply(sorted)
    assert all(phases == ["after", "before"] for phases in snapshots)
    # each snapshot carries the flags judged when it was taken (farm-arm runs under qemu)
    emulated = set(runs.loc[runs["device_emulated"], "measurement_id"])
    for row in frames["snapshots"].itertuples():
        fingerprint = json.loads(row.fingerprint)
        assert fingerprint["flags"] == snapshot_flags(fingerprint, row.phase)
        assert ("emulated" in fingerprint["flags"]) == (row.measurement_id in emulated)
    # recall is the workload's own answer check on the generated ids, stored per run
    outcomes = frames["outcomes"]
    assert len(outcomes) == 8 and outcomes["expected_answer"].str.fullmatch(r"\d{5}").all()
    for row in outcomes.itertuples():
        generated = json.loads(row.generated_ids)
        assert generated and row.text == answer_text(needle_model, generated)
        assert row.recall == float(check_answer(needle_model, generated, row.expected_answer))

    store.close()


def test_resume_skips_ok_runs_and_force_redoes_them(ray_address: str, needle_model: Path,
                                                    tmp_path: Path, capsys) -> None:
    spec = load_spec(needle_spec(tmp_path, "resume", needle_model, ["local"]))
    inventory = load_inventory(None)
    store = Store.open(f"sqlite:///{tmp_path}/resume.db")
    first = run_experiment(RunRequest(spec, inventory, ["local"]), store)
    assert (first.total, first.counts["ok"]) == (2, 2)
    # a dry run names the stored runs without building and leaves them out of the time
    assert main(["--db", f"sqlite:///{tmp_path}/resume.db", "run", str(spec.path),
                 "--devices", "local", "--dry-run"]) == 0
    assert "2 of them already stored as ok: skipped" in capsys.readouterr().out
    runs = stored_runs(store, "resume")
    again = run_experiment(RunRequest(spec, inventory, ["local"]), store)
    assert (again.skipped, sum(again.counts.values())) == (2, 0)
    assert stored_runs(store, "resume")["finished_at"].tolist() == runs["finished_at"].tolist()
    first_measurements = every_measurement(store, "resume")
    for _ in range(2):  # --force twice: each adds a measurement per run
        forced = run_experiment(RunRequest(spec, inventory, ["local"], force=True), store)
        assert (forced.skipped, forced.counts["ok"]) == (0, 2)
    rerun = stored_runs(store, "resume")
    every = every_measurement(store, "resume")
    summary = store.experiment_summary("resume")
    store.close()
    assert len(rerun) == 2 and rerun["run_key"].tolist() == runs["run_key"].tolist()
    assert (rerun["finished_at"].values > runs["finished_at"].values).all()  # the latest ok
    assert every.groupby("run_key")["attempt"].apply(list).tolist() == [[1, 2, 3]] * 2
    assert set(every["status"]) == {"ok"} and summary.counts["ok"] == 2
    kept = as_measured(every[every["attempt"] == 1])
    pd.testing.assert_frame_equal(kept, as_measured(first_measurements),
                                  check_dtype=False)  # the first ones, unchanged


def test_runs_another_experiment_completed_are_skipped_and_listed(ray_address: str,
                                                                  needle_model: Path,
                                                                  tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/shared.db")
    inventory = load_inventory(None)
    first = run_experiment(RunRequest(
        load_spec(needle_spec(tmp_path, "first", needle_model, ["local"])), inventory, ["local"]),
        store)
    second_spec = needle_spec(tmp_path, "second", needle_model, ["local"])
    second = run_experiment(RunRequest(load_spec(second_spec), inventory, ["local"]), store)
    runs_first, runs_second = stored_runs(store, "first"), stored_runs(store, "second")
    store.close()
    assert first.counts["ok"] == 2 and (second.skipped, sum(second.counts.values())) == (2, 0)
    assert sorted(runs_second["run_key"]) == sorted(runs_first["run_key"])


def test_engine_failure_is_stored_as_failed_and_redone(ray_address: str, needle_model: Path,
                                                       tmp_path: Path) -> None:
    broken = tmp_path / "broken-model"
    shutil.copytree(needle_model, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # the engine cannot load it
    spec = load_spec(needle_spec(tmp_path, "broken", broken, ["local"]))
    url = f"sqlite:///{tmp_path}/broken.db"
    inventory = load_inventory(None)
    with Store.open(url) as store:
        summary = run_experiment(RunRequest(spec, inventory, ["local"]), store)
        assert summary.counts["failed"] == 2 and summary.complete
        runs = stored_runs(store, "broken")
        assert set(runs["status"]) == {"failed"}
        assert (runs["exit_code"] != 0).all()
        assert all("safetensors" in e or "model" in e for e in runs["error"]), runs["error"]
        # failed runs are not "done": a rerun tries them again
        assert run_experiment(RunRequest(spec, inventory, ["local"]), store).skipped == 0


def wait_for_a_new_running_attempt(proc: subprocess.Popen, store: Store,
                                   experiment: str) -> None:
    """Until an attempt not yet stored is stored running: one just dispatched, with its whole
    run still ahead of it (one seen running earlier could be about to finish)."""
    known = set(every_measurement(store, experiment)["measurement_id"])

    def dispatched() -> bool:
        every = every_measurement(store, experiment)
        new = every[~every["measurement_id"].isin(known)]
        return "running" in set(new["status"])
    wait_until(proc, dispatched)


def test_sigkilled_coordinator_rerun_executes_only_missing_runs(
        ray_address: str, needle_model: Path, tmp_path: Path) -> None:
    # runs of a known length on a board that sleeps before every command: the kill lands
    # while a run is on the board (a short run could finish between seeing it running and the
    # kill) and while the matrix is far from done
    spec_path = needle_spec(tmp_path, "killed", needle_model, ["local"],
                            depths=(0.1, 0.4, 0.7, 1.0))
    inventory = slow_local_board(tmp_path, 0.6)
    url = f"sqlite:///{tmp_path}/killed.db"
    store = Store.open(url)  # creates the schema before the coordinator starts
    proc = start_cli(["--db", url, "run", str(spec_path), "--inventory", str(inventory),
                      "--ray-address", ray_address, "--lease-ttl", "3"], tmp_path)
    try:
        wait_for_ok_runs(proc, store, "killed", 2)
        # killed with a run in flight: its attempt is in the store, running
        wait_for_a_new_running_attempt(proc, store, "killed")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
    before = every_measurement(store, "killed")
    done = set(before.loc[before["status"] == "ok", "run_key"])
    assert 2 <= len(done) < 8 and "running" in set(before["status"])

    summary = run_experiment(RunRequest(load_spec(spec_path), load_inventory(inventory),
                                        ["local"]), store)
    assert summary.skipped == len(done)
    assert summary.counts["ok"] == 8 - len(done)
    after = stored_runs(store, "killed")
    every = every_measurement(store, "killed")
    store.close()
    assert len(after) == 8 and after["run_key"].is_unique and set(after["status"]) == {"ok"}
    # the attempt in flight at the kill shows as lost (its lease expired), and was redone
    lost = every[every["status"] == "lost"]
    assert lost["measurement_id"].tolist() == \
        before.loc[before["status"] == "running", "measurement_id"].tolist()
    assert lost["lease_expired"].all() and set(lost["run_key"]) <= set(after["run_key"])
    # the measurements made before the kill were kept as they were, not redone
    earlier = as_measured(before[before["status"] == "ok"])
    pd.testing.assert_frame_equal(as_measured(every).loc[earlier.index], earlier,
                                  check_dtype=False)


def running_attempts(db_path: Path) -> int:
    with closing(sqlite3.connect(db_path)) as db:
        query = "SELECT count(*) FROM measurements WHERE status = 'running'"
        return db.execute(query).fetchone()[0]


def interrupt_inside_a_run(proc: subprocess.Popen, db_path: Path) -> str:
    """SIGINT the CLI while a run is in flight: once its progress line has reported a finished
    run and the store holds the next attempt as running (each command on the slow board
    sleeps first, so that run lasts seconds after its row appears); its whole stderr."""
    watch = watch_stderr(proc, " ok local:")
    try:
        assert watch.seen.wait(180), "the coordinator made no progress: " + watch.text
        wait_until(proc, lambda: running_attempts(db_path) > 0)
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    watch.reader.join(timeout=10)
    return watch.text


def test_ctrl_c_stops_cleanly_and_rerun_completes(ray_address: str, needle_model: Path,
                                                  tmp_path: Path) -> None:
    depths = tuple(round(i / 3, 3) for i in range(4))
    spec_path = needle_spec(tmp_path, "ctrl-c", needle_model, ["local"], depths=depths)
    db_path = tmp_path / "ctrlc.db"
    url = f"sqlite:///{db_path}"
    store = Store.open(url)
    proc = start_cli(["--db", url, "run", str(spec_path), "--ray-address", ray_address,
                      "--inventory", str(slow_local_board(tmp_path, 1.0))], tmp_path)
    stderr = interrupt_inside_a_run(proc, db_path)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr
    runs = stored_runs(store, "ctrl-c")
    assert set(runs["status"]) <= {"ok", "interrupted"}
    interrupted = runs[runs["status"] == "interrupted"]
    assert len(interrupted) >= 1 and all("interrupted" in e for e in interrupted["error"])
    before = every_measurement(store, "ctrl-c")
    summary = run_experiment(RunRequest(load_spec(spec_path), load_inventory(None), ["local"]),
                             store)
    assert summary.skipped + summary.counts["ok"] == 2 * len(depths)
    assert set(stored_runs(store, "ctrl-c")["status"]) == {"ok"}
    # the resume added measurements: the interrupted attempts are still there, unchanged
    every = as_measured(every_measurement(store, "ctrl-c"))
    store.close()
    earlier = as_measured(before)
    pd.testing.assert_frame_equal(every.loc[earlier.index], earlier, check_dtype=False)
    assert len(every) == len(before) + summary.counts["ok"]


def test_board_needing_a_missing_ray_resource_is_refused(ray_address: str, needle_model: Path,
                                                         tmp_path: Path) -> None:
    inventory_path = tmp_path / "inventory.toml"
    inventory_path.write_text('[[device]]\nname = "local"\nresources = { gateway_b7 = 1 }\n')
    spec = load_spec(needle_spec(tmp_path, "resources", needle_model, ["local"]))
    with Store.open(f"sqlite:///{tmp_path}/res.db") as store:
        with pytest.raises(InputError, match="device 'local': key 'resources'.*'gateway_b7'"):
            run_experiment(RunRequest(spec, load_inventory(inventory_path)), store)
        assert stored_runs(store, "resources").empty
