"""Board-side abort: a coordinator SIGTERMed with a run in flight on a farm node over SSH
kills that run's whole session on the board (the engine and what it started) and gives the
board back at once: another coordinator of the store, waiting for it, takes it on its next try
(no waiting for the lease to run out, nor for the lock file). A run past its timeout loses
even what it started in a process group of its own, and a run whose lease another holder took
is killed on the board too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from datetime import timedelta
from pathlib import Path

from fixtures_farm import session_members
from fixtures_ray import CoordFarm, needle_spec, start_cli, stored_runs, watch_stderr
from sqlalchemy import update

from db.leases import utcnow
from db.models import Lease
from db.store import Store
from devices.boardlock import LOCK_FILE, holder_record
from devices.inventory import load_inventory
from harness.execution.coordinator import RunRequest, run_experiment
from harness.spec import load_spec


def x86_prefixed(farm: CoordFarm, folder: Path, script: str) -> Path:
    """The farm's inventory with farm-x86 running every command under ``sh -c script``."""
    tables = farm.inventory.read_text().split("[[device]]")
    for i, table in enumerate(tables):
        if 'name = "farm-x86"' in table:
            tables[i] = table.replace("exec_prefix = []",
                                      f'exec_prefix = ["sh", "-c", {json.dumps(script)}]')
    path = folder / "x86-prefixed.toml"
    path.write_text("[[device]]".join(tables))
    return path


def slow_x86(farm: CoordFarm, folder: Path, seconds: float) -> Path:
    """farm-x86 sleeping before every command: a run that outlasts the test unless it is
    killed (the sleep is part of the run's session)."""
    return x86_prefixed(farm, folder, f'sleep {seconds}; exec "$0" "$@"')


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return proc.returncode, out


def test_sigterm_mid_run_kills_the_run_on_the_board_and_the_other_coordinator_takes_it(
        ray_address: str, coord_farm: CoordFarm, needle_model: Path, tmp_path: Path) -> None:
    workdir = coord_farm.state / "nodes" / "farm-x86" / "work"
    url = f"sqlite:///{tmp_path}/abort.db"
    store = Store.open(url)
    # the victim's runs sleep 60 s on the board first; the other's are the plain board's
    inventories = {"abort-victim": slow_x86(coord_farm, tmp_path, 60),
                   "abort-other": coord_farm.inventory}
    specs = {name: needle_spec(tmp_path, name, needle_model, ["farm-x86"], depths=depths,
                               warmups=0)
             for name, depths in (("abort-victim", (0.2,)), ("abort-other", (0.3, 0.6)))}

    def start(name: str) -> subprocess.Popen:
        # a long lease: a board given back "at once" and one whose lease ran out are far apart
        return start_cli(["--db", url, "run", str(specs[name]), "--inventory",
                          str(inventories[name]), "--ray-address", ray_address, "--lease-ttl",
                          "120"], tmp_path)

    def victim_runs_on_the_board() -> dict[str, str] | None:
        job, lease = store.jobs.latest("abort-victim"), store.leases.get("farm-x86")
        path = workdir / LOCK_FILE
        record = holder_record(path.read_text()) if path.exists() else {}
        if job is None or lease is None or lease.run_key is None or \
                lease.holder != job.holder or record.get("coordinator") != job.holder or \
                record.get("run") != lease.run_key:
            return None
        return record

    def wait_for(condition, proc: subprocess.Popen, what: str) -> None:
        deadline = time.monotonic() + 240
        while not condition():
            assert proc.poll() is None and time.monotonic() < deadline, what
            time.sleep(0.05)

    victim = start("abort-victim")
    procs = [victim]
    try:
        wait_for(victim_runs_on_the_board, victim, "the victim never ran on the board")
        other = start("abort-other")  # comes while the victim's run is in flight
        procs.append(other)
        waiting = watch_stderr(other, "is leased by")
        wait_for(waiting.seen.is_set, other, "the other coordinator did not wait")
        record = victim_runs_on_the_board()
        assert record is not None, "the victim's run ended before the other came"
        held = store.leases.get("farm-x86")
        assert session_members(record["sid"])  # the run is in flight on the board
        os.kill(victim.pid, signal.SIGTERM)
        stopped, stopped_at = time.monotonic(), utcnow()
        code, out = finish(victim, 60)
        time.sleep(max(0.0, 5.0 - (time.monotonic() - stopped)))
        assert session_members(record["sid"]) == [], "the run's processes outlived 5 s"
        assert code == 143, out
        other_code, other_out = finish(other)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    waiting.reader.join(timeout=10)
    assert other_code == 0, waiting.text
    assert "4 ok" in other_out, other_out
    assert not any("lock file" in line for line in waiting.lines), waiting.text
    victims = stored_runs(store, "abort-victim")
    interrupted = victims[victims["status"] == "interrupted"]
    assert interrupted["run_key"].tolist() == [record["run"]], victims[["status", "run_key"]]
    # the other coordinator's runs after the stop came long before the victim's lease ended
    others = stored_runs(store, "abort-other")
    store.close()
    assert set(others["status"]) == {"ok"}
    after = others[others["started_at"] > stopped_at]
    assert not after.empty and after["started_at"].max() < held.expires, (others, held)


def test_a_run_past_its_timeout_leaves_nothing_behind_on_the_board(
        ray_address: str, coord_farm: CoordFarm, needle_model: Path, tmp_path: Path) -> None:
    """The engine stands in for one that starts a helper in a process group of its own and
    hangs: GNU timeout kills its own group at the deadline, the abort the rest."""
    workdir = coord_farm.state / "nodes" / "farm-x86" / "work"
    inventory = x86_prefixed(coord_farm, tmp_path,
                             "python3 -c 'import os, time; os.setpgid(0, 0); time.sleep(300)' "
                             ">/dev/null 2>&1 & sleep 60")
    spec = load_spec(needle_spec(tmp_path, "past-timeout", needle_model, ["farm-x86"],
                                 depths=(0.5,), warmups=0, extra="timeout_s = 3"))
    with Store.open(f"sqlite:///{tmp_path}/timeout.db") as store:
        summary = run_experiment(RunRequest(spec, load_inventory(inventory)), store)
        runs = stored_runs(store, "past-timeout")
    assert summary.counts["failed"] == 2
    assert set(runs["status"]) == {"failed"} and runs["error"].str.contains("timeout").all()
    record = holder_record((workdir / LOCK_FILE).read_text())
    assert record["run"] in set(runs["run_key"])
    assert session_members(record["sid"]) == []


def test_a_lease_lost_mid_run_kills_the_run_on_the_board(
        ray_address: str, coord_farm: CoordFarm, needle_model: Path, tmp_path: Path) -> None:
    """Another holder takes the board's lease in the store while a run is in flight (as after
    a stall longer than the lease time): the coordinator's next renewal finds it lost and the
    run's session on the board is killed; the coordinator then waits for the new holder."""
    workdir = coord_farm.state / "nodes" / "farm-x86" / "work"
    url = f"sqlite:///{tmp_path}/stolen.db"
    store = Store.open(url)
    spec = needle_spec(tmp_path, "stolen-lease", needle_model, ["farm-x86"], depths=(0.4,),
                       warmups=0)
    victim = start_cli(["--db", url, "run", str(spec), "--inventory",
                        str(slow_x86(coord_farm, tmp_path, 60)), "--ray-address", ray_address,
                        "--lease-ttl", "120"], tmp_path)
    watch = watch_stderr(victim, "is leased by thief")
    try:
        deadline = time.monotonic() + 240
        record: dict[str, str] = {}
        while not record.get("sid"):
            assert victim.poll() is None and time.monotonic() < deadline, watch.text
            lease, path = store.leases.get("farm-x86"), workdir / LOCK_FILE
            job = store.jobs.latest("stolen-lease")
            if lease and job and lease.run_key and lease.holder == job.holder and path.exists():
                found = holder_record(path.read_text())
                if found.get("run") == lease.run_key and session_members(found.get("sid", "")):
                    record = found
            time.sleep(0.05)
        with store.database.begin() as conn:
            conn.execute(update(Lease.__table__).where(Lease.board == "farm-x86").values(
                lease_id=str(uuid.uuid4()), holder="thief", run_key=None,
                expires=utcnow() + timedelta(seconds=600)))
        deadline = time.monotonic() + 30  # a bound, not a speed: the renewal is every second
        while session_members(record["sid"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert session_members(record["sid"]) == [], "the run outlived its lost lease"
        assert victim.poll() is None  # it waits for the board, it did not fail
        wait_deadline = time.monotonic() + 60
        while not watch.seen.is_set() and time.monotonic() < wait_deadline:
            time.sleep(0.1)
    finally:
        victim.terminate()
        finish(victim, 60)
        store.close()
    watch.reader.join(timeout=10)
    assert any("its lease expired while a run was in flight" in line for line in watch.lines), \
        watch.text
    assert watch.seen.is_set(), watch.text
