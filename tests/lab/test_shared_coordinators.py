"""Coordinators sharing a store and a board, as real `benchfarm` processes on the real engine,
model and Ray: two `run`s on one SQLite file and on PostgreSQL, a SIGKILLed lease holder,
submit -> serve -> queue -> cancel -> restarted serve, and a SIGSTOPped holder whose late result
must not replace the other's."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from fixtures_db import fresh_postgres_database
from fixtures_ray import (
    cli_here,
    count_ok,
    every_measurement,
    needle_spec,
    slow_local_board,
    start_cli,
    stored_runs,
)

from db.leases import utcnow
from db.store import Store

DEPTHS = (0.1, 0.4, 0.7, 1.0)  # with exact + sparse: 8 runs per experiment


def finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, out, err


def wait_for(predicate, what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def assert_no_overlap(runs: pd.DataFrame) -> None:
    starts, ends = list(runs["started_at"]), list(runs["finished_at"])
    for i in range(1, len(runs)):
        assert starts[i] >= ends[i - 1], f"runs {i - 1} and {i} overlap on the board:\n{runs}"


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_two_coordinators_take_turns_on_one_board(
        backend: str, request: pytest.FixtureRequest, ray_address: str, needle_model: Path,
        tmp_path: Path) -> None:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path}/shared.db"
    else:
        url = fresh_postgres_database(request.getfixturevalue("postgres_server"))
    Store.open(url).close()
    # the same matrix under two names: two people running one spec at once
    names = ["turns-a", "turns-b"]
    specs = [needle_spec(tmp_path, name, needle_model, ["local"], depths=DEPTHS, ctx=256)
             for name in names]
    # runs of a known length (the board sleeps before each command): the matrix outlasts the
    # seconds between the two coordinators' starts (joining Ray ships the code first)
    inventory = str(slow_local_board(tmp_path, 0.8))
    procs = [start_cli(["--db", url, "run", str(spec), "--inventory", inventory,
                        "--ray-address", ray_address], tmp_path) for spec in specs]
    outcomes = [finish(proc) for proc in procs]
    for code, _, err in outcomes:
        assert code == 0, err
    with Store.open(url) as store:
        runs = {name: stored_runs(store, name) for name in names}
        experiment_ids = {name: store.jobs.latest(name) for name in names}
        jobs = store.jobs.list(None)
    # each run of the matrix ran once, and belongs to both experiments
    assert set(runs["turns-a"]["run_key"]) == set(runs["turns-b"]["run_key"])
    board = runs["turns-a"].sort_values("started_at").reset_index(drop=True)
    assert len(board) == 8 and board["run_key"].is_unique and set(board["status"]) == {"ok"}
    assert board["lease_id"].notna().all() and board["lease_id"].is_unique
    assert_no_overlap(board)
    # they took turns: the coordinator that made each run changes along the board's timeline
    makers = board["experiment_id"]
    assert makers.nunique() == 2, board[["experiment_id", "started_at"]]
    assert int((makers != makers.shift()).sum()) - 1 >= 3, board[["experiment_id", "started_at"]]
    done_elsewhere = sum(int(out.split("done meanwhile by another coordinator")[0]
                             .rsplit(", ", 1)[1]) for _, out, _ in outcomes
                         if "done meanwhile" in out)
    assert done_elsewhere == 8
    assert all(job is not None for job in experiment_ids.values())
    assert sorted((j.experiment, j.state, j.kind) for j in jobs) == [
        ("turns-a", "done", "run"), ("turns-b", "done", "run")]


def test_a_killed_holders_lease_expires_and_the_other_coordinator_goes_on(
        ray_address: str, needle_model: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/killed.db"
    store = Store.open(url)
    ttl = "3"
    victim_spec = needle_spec(tmp_path, "victim", needle_model, ["local"], depths=DEPTHS,
                              ctx=256)
    survivor_spec = needle_spec(tmp_path, "survivor", needle_model, ["local"],
                                depths=(0.2, 0.5, 0.8), ctx=256)
    # runs of a known length: the victim is surely mid-matrix when it is killed
    inventory = str(slow_local_board(tmp_path, 0.5))
    victim, survivor = (start_cli(["--db", url, "run", str(spec), "--inventory", inventory,
                                   "--ray-address", ray_address, "--lease-ttl", ttl], tmp_path)
                        for spec in (victim_spec, survivor_spec))
    try:
        def victim_holds_the_board() -> bool:
            job, lease = store.jobs.latest("victim"), store.leases.get("local")
            return (count_ok(store, "victim") >= 1 and job is not None and lease is not None
                    and lease.holder == job.holder and lease.expires > utcnow())

        try:
            wait_for(lambda: victim_holds_the_board() or victim.poll() is not None,
                     "the victim to hold the board")
            assert victim.poll() is None, victim.communicate()
        finally:
            os.kill(victim.pid, signal.SIGKILL)
            victim.communicate()
        held = store.leases.get("local")  # read after the kill: it can no longer be renewed
        assert held.holder == store.jobs.latest("victim").holder
        code, out, err = finish(survivor)
    finally:
        if survivor.poll() is None:
            survivor.kill()
    assert code == 0, err
    assert "6 ok" in out, out
    survived = stored_runs(store, "survivor")
    assert set(survived["status"]) == {"ok"}
    # the survivor's runs after the kill waited for the dead holder's lease to run out
    later = survived[survived["started_at"] > held.acquired]
    assert not later.empty and later["started_at"].min() >= held.expires
    assert store.leases.get("local").holder != held.holder
    store.close()


def test_submit_serve_stop_cancel_restart_loses_nothing_and_runs_nothing_twice(
        ray_address: str, needle_model: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/queue.db"
    store = Store.open(url)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return cli_here(capsys, "--db", url, *args)

    # every command 1.5 s longer: SIGTERM and cancel land with a run in flight (longer than the
    # scheduler waits for a result before it looks at its job again)
    inventory = str(slow_local_board(tmp_path, 1.5))
    specs = {name: needle_spec(tmp_path, name, needle_model, ["local"], depths=depths)
             for name, depths in (("q-long", DEPTHS), ("q-cancel", (0.15, 0.45, 0.75, 0.95)),
                                  ("q-dropped", DEPTHS))}
    assert cli("submit", str(specs["q-long"]), "--priority", "2", "--owner", "ann"
               ).returncode == 0
    assert cli("submit", str(specs["q-cancel"]), "--priority", "1").returncode == 0
    assert cli("submit", str(specs["q-dropped"])).returncode == 0
    queued = cli("queue").stdout
    assert queued.index("q-long") < queued.index("q-cancel") < queued.index("q-dropped")

    serve = start_cli(["--db", url, "serve", "--ray-address", ray_address, "--poll", "0.2",
                       "--inventory", inventory], tmp_path)
    try:
        wait_for(lambda: count_ok(store, "q-long") >= 1 or serve.poll() is not None,
                 "a run of q-long")
        status = cli("status", "q-long")
        assert status.returncode == 0, status.stderr
        assert "job 1: running" in status.stdout, status.stdout
        # the matrix per board: board, matrix, stored ok / failed / interrupted / pending /
        # cancelled / running / lost, not started: the same counts as the summary above
        row = re.search(r"^local +8 +(\d+) +0 +0 +0 +0 +([01]) +0 +(\d+)$", status.stdout,
                        re.M)
        assert row and int(row[1]) >= 1 and sum(map(int, row.groups())) == 8, status.stdout
        wait_for(lambda: count_ok(store, "q-long") >= 2 or serve.poll() is not None,
                 "two runs of q-long")
        os.kill(serve.pid, signal.SIGTERM)  # like `ray job stop` or systemd
        code, _, err = finish(serve, 60)
    finally:
        if serve.poll() is None:
            serve.kill()
    assert code == 143, err
    before = stored_runs(store, "q-long")
    done = set(before.loc[before["status"] == "ok", "run_key"])
    assert 2 <= len(done) < 8
    # the run in flight when SIGTERM came got its row
    assert set(before["status"]) == {"ok", "interrupted"}, before[["status", "error"]]
    long_job = store.jobs.latest("q-long")
    assert long_job.state == "queued" and "requeued" in long_job.message

    cancelled = cli("cancel", "q-dropped")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cli("cancel", "q-dropped").returncode == 2  # nothing left to cancel

    # the restarted service finishes q-long, then q-cancel is cancelled in the middle of a run
    restarted = start_cli(["--db", url, "serve", "--ray-address", ray_address,
                           "--until-idle", "--inventory", inventory], tmp_path)
    try:
        wait_for(lambda: count_ok(store, "q-cancel") >= 1 or restarted.poll() is not None,
                 "a run of q-cancel")
        time.sleep(0.3)
        store.jobs.cancel(store.jobs.latest("q-cancel").id, "test", "cancelled by the test")
        code, out, err = finish(restarted)
    finally:
        if restarted.poll() is None:
            restarted.kill()
    assert code == 0, err
    after = stored_runs(store, "q-long")
    assert len(after) == 8 and after["run_key"].is_unique and set(after["status"]) == {"ok"}
    kept = after[after["run_key"].isin(done)].set_index("run_key")["finished_at"]
    assert (kept == before.set_index("run_key").loc[kept.index, "finished_at"]).all()
    stopped = stored_runs(store, "q-cancel")  # other depths: other runs than q-long's
    assert set(stopped["status"]) == {"ok", "cancelled"} and len(stopped) < 8
    assert (stopped["status"] == "cancelled").sum() == 1, stopped[["status", "error"]]
    assert stored_runs(store, "q-dropped").empty
    states = {j.experiment: j.state for j in store.jobs.list(None)}
    assert states == {"q-long": "done", "q-cancel": "cancelled", "q-dropped": "cancelled"}
    assert "cancelled" in out
    assert "q-long" not in cli("queue").stdout  # nothing active left
    store.close()


def stop_outside_a_write(proc: subprocess.Popen, path: Path) -> None:
    """SIGSTOP ``proc`` at a moment it holds no write lock on the SQLite file (a process stopped
    inside a write would block every other writer, which is not what is tested here)."""
    for _ in range(100):
        os.kill(proc.pid, signal.SIGSTOP)
        probe = sqlite3.connect(path, timeout=0.2)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.rollback()
            return
        except sqlite3.OperationalError:
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.05)
        finally:
            probe.close()
    raise AssertionError(f"{path} stayed locked by process {proc.pid}")


def running_attempts(store: Store, experiment: str) -> pd.DataFrame:
    every = every_measurement(store, experiment)
    return every[every["status"] == "running"] if len(every) else every


def stop_with_a_run_in_flight(proc: subprocess.Popen, store: Store, experiment: str,
                              path: Path) -> pd.Series:
    """SIGSTOP the coordinator once a run is ok and another in flight (outside a write of its
    own); the attempt in flight."""
    for _ in range(20):
        wait_for(lambda: (count_ok(store, experiment) >= 1
                          and len(running_attempts(store, experiment)) == 1)
                 or proc.poll() is not None, f"a run of {experiment} in flight")
        assert proc.poll() is None, proc.communicate()
        stop_outside_a_write(proc, path)
        if len(running_attempts(store, experiment)) == 1:
            return running_attempts(store, experiment).iloc[0]
        os.kill(proc.pid, signal.SIGCONT)
    raise AssertionError(f"{experiment}: no run in flight to stop at")


def stall_run(url: str, spec: Path, inventory: str, ray_address: str,
              cwd: Path) -> subprocess.Popen:
    return start_cli(["--db", url, "run", str(spec), "--inventory", inventory,
                      "--ray-address", ray_address, "--lease-ttl", "3"], cwd)


def test_a_stalled_coordinators_late_result_never_replaces_the_others(
        ray_address: str, needle_model: Path, tmp_path: Path) -> None:
    """Coordinator A stopped (SIGSTOP) past its lease with a run in flight; B takes
    the board, finds A's attempt lost and stores the run ok; A's late result, once it goes on,
    is kept as A's own attempt, marked as from an expired lease, and counted nowhere."""
    url = f"sqlite:///{tmp_path}/stalled.db"
    store = Store.open(url)
    specs = [needle_spec(tmp_path, name, needle_model, ["local"], depths=DEPTHS, ctx=256)
             for name in ("stall-a", "stall-b")]  # one matrix under two names
    inventory = str(slow_local_board(tmp_path, 0.5))
    a = stall_run(url, specs[0], inventory, ray_address, tmp_path)
    b = None
    try:
        stalled = stop_with_a_run_in_flight(a, store, "stall-a", tmp_path / "stalled.db")
        b = stall_run(url, specs[1], inventory, ray_address, tmp_path)
        code_b, out_b, err_b = finish(b)
        os.kill(a.pid, signal.SIGCONT)
        code_a, out_a, err_a = finish(a)
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
    assert (code_a, code_b) == (0, 0), err_a + err_b
    tries = every_measurement(store, "stall-b").set_index("measurement_id")
    mine = tries[tries["run_key"] == stalled["run_key"]]
    # A's attempt: kept, completed by A's late result, marked; B's ok is the run's
    late = mine.loc[stalled["measurement_id"]]
    assert late["lease_expired"] and late["lease_id"] == stalled["lease_id"]
    # (lost when A, on resuming, finds its lease gone and aborts the run on the board first)
    assert late["status"] in ("ok", "failed", "lost") and late["finished_at"] is not None
    counted = mine[(mine["status"] == "ok") & ~mine["lease_expired"].astype(bool)]
    assert len(counted) == 1 and counted.iloc[0]["lease_id"] != stalled["lease_id"]
    current = stored_runs(store, "stall-a").set_index("run_key").loc[stalled["run_key"]]
    assert current["measurement_id"] == counted.index[0]
    # the counts are not inflated: each of the 8 runs is ok once, across both coordinators
    # A's summary names its late result, unless A aborted the run as lost before it came
    assert ("1 finished after their lease expired" in out_a) == (late["status"] != "lost"), out_a
    assert "done meanwhile by another coordinator" in out_a  # its run again: B's, dropped
    ok_a, ok_b = (int(re.search(r"(\d+) ok", out)[1]) for out in (out_a, out_b))
    assert ok_a + ok_b == 8, (out_a, out_b)
    for name in ("stall-a", "stall-b"):
        assert store.experiment_summary(name).counts["ok"] == 8
    assert len(store.completed_run_keys()) == 8
    store.close()


def test_a_stalled_coordinator_alone_runs_its_expired_run_again(
        ray_address: str, needle_model: Path, tmp_path: Path) -> None:
    """No other coordinator took the board: a late result under an expired lease (or one the
    coordinator aborted on finding its lease gone) is not the run's ok, and the run runs again
    under a new lease; if the coordinator renewed its lapsed lease first, nobody else ran on the
    board and its result stands. Either way every run is ok exactly once."""
    url = f"sqlite:///{tmp_path}/alone.db"
    store = Store.open(url)
    spec = needle_spec(tmp_path, "alone", needle_model, ["local"], depths=(0.2, 0.6), ctx=256)
    proc = stall_run(url, spec, str(slow_local_board(tmp_path, 0.5)), ray_address, tmp_path)
    try:
        stalled = stop_with_a_run_in_flight(proc, store, "alone", tmp_path / "alone.db")
        time.sleep(4.5)  # past the 3 s lease
        os.kill(proc.pid, signal.SIGCONT)
        code, out, err = finish(proc)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
    assert code == 0, err
    assert "4 ok" in out, out
    tries = every_measurement(store, "alone")
    mine = tries[tries["run_key"] == stalled["run_key"]].sort_values("attempt")
    first = mine.iloc[0]
    if len(mine) == 1:
        # it renewed its lapsed lease before anyone else took the board: nobody else ran
        # there, so its result is a valid measurement under that (renewed) lease
        assert first["status"] == "ok" and not bool(first["lease_expired"]), mine
    else:
        # the stalled attempt is kept and not counted: its result came in after the lease
        # expired (marked so), or the coordinator found its lease gone first and aborted the
        # run on the board (stored lost); then the run ran again under a new lease
        late = bool(first["lease_expired"])
        assert late or first["status"] == "lost", mine[["status", "lease_expired"]]
        assert ("1 finished after their lease expired" in out) == (
            late and first["status"] != "lost")
        assert len(mine) == 2 and not bool(mine["lease_expired"].iloc[1])
        assert mine["status"].iloc[1] == "ok" and mine["lease_id"].nunique() == 2
    assert store.experiment_summary("alone").counts["ok"] == 4
    store.close()
