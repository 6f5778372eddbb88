"""The lock file in a board's workdir (devices.boardlock), held here by a real flock as another
coordinator's command would hold it: over SSH on a farm node and on the local device nothing
runs while it is held; a `benchfarm run` with a store of its own waits, says so, and finishes
once the lock is free. A command under the lock records its holder, which a refused one names;
``abort_run`` kills the holder's whole session; a lock whose holder is gone is taken over."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fixtures_farm import session_members, session_of
from fixtures_ray import needle_spec, start_cli, stored_runs, watch_stderr

from db.store import Store
from devices.boardlock import LOCK_FILE, LockHolder, holder_record, locked
from devices.connect import connect
from devices.errors import BoardLocked, DeviceError
from devices.fingerprint import probed_run
from devices.inventory import Device, local_device
from harness.execution.runner import abort_run

HOLDER = LockHolder("test-host:1:abc", "sqlite:///test.db", 7, "run-one")
OTHER = LockHolder("test-host:2:def", "sqlite:///other.db", None, "run-two")


@contextmanager
def board_lock(workdir: Path) -> Iterator[None]:
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / LOCK_FILE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@pytest.mark.parametrize("name", ["farm-x86", "local"])
def test_nothing_runs_while_another_command_holds_the_lock(name: str, farm,
                                                           tmp_path: Path) -> None:
    found = local_device() if name == "local" else farm.inventory.get(name)
    device: Device = dataclasses.replace(found, workdir=str(tmp_path / "work"))
    marker = tmp_path / "ran"
    with connect(device) as transport:
        with board_lock(tmp_path / "work"), pytest.raises(BoardLocked, match=LOCK_FILE):
            probed_run(transport, ["touch", str(marker)], timeout=30, lock=HOLDER)
        assert not marker.exists()
        probed = probed_run(transport, ["touch", str(marker)], timeout=30, lock=HOLDER)
    assert probed.result.exit_code == 0 and marker.exists()


def test_a_coordinator_with_its_own_store_waits_for_the_lock(
        ray_address: str, needle_model: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "local-work"
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(f'[[device]]\nname = "local"\nworkdir = "{workdir}"\n')
    spec = needle_spec(tmp_path, "locked", needle_model, ["local"])
    url = f"sqlite:///{tmp_path}/own.db"
    with board_lock(workdir):
        proc = start_cli(["--db", url, "run", str(spec), "--inventory", str(inventory),
                          "--ray-address", ray_address], tmp_path)
        watch = watch_stderr(proc, "is held by a command that recorded no holder")
        assert watch.seen.wait(120), watch.text
        time.sleep(1.0)  # several more tries while it is held
        with Store.open(url) as store:
            assert stored_runs(store, "locked").empty
    out = proc.stdout.read()
    proc.wait(timeout=120)
    watch.reader.join(timeout=10)
    assert proc.returncode == 0, watch.text
    assert "2 ok" in out
    assert sum("lock file" in line for line in watch.lines) == 1  # said once, not every try


@pytest.mark.parametrize("name", ["farm-x86", "local"])
def test_the_holder_is_named_aborted_with_its_session_and_a_gone_one_taken_over(
        name: str, farm, tmp_path: Path) -> None:
    found = local_device() if name == "local" else farm.inventory.get(name)
    workdir = tmp_path / "work"
    device: Device = dataclasses.replace(found, workdir=str(workdir))
    with connect(device) as holder, connect(device) as other:
        # a run whose command starts children of its own (a shell and a sleep)
        outcome: dict[str, object] = {}
        thread = threading.Thread(target=lambda: outcome.setdefault("result", holder.run_host(
            locked(["sh", "-c", "sleep 300; echo late"], HOLDER), timeout=600)))
        thread.start()
        sid = session_of(workdir)
        assert len(session_members(sid)) >= 2
        with pytest.raises(BoardLocked) as refused:
            probed_run(other, ["true"], timeout=30, lock=OTHER)
        message = str(refused.value)
        for part in ("test-host:1:abc", "sqlite:///test.db", "job 7", "run run-one", "pid "):
            assert part in message, message
        assert not abort_run(other, "another-run")  # not the holder: nothing is killed
        assert session_members(sid)
        assert abort_run(other, "run-one")
        assert session_members(sid) == []
        thread.join(30)
        assert "late" not in outcome["result"].stdout
        assert probed_run(other, ["true"], timeout=30, lock=OTHER).result.exit_code == 0

        # the holder's process is gone while a child it left holds the lock: taken over
        started = holder.run_host(locked(["sh", "-c", "sleep 300 >/dev/null 2>&1 & exit 0"],
                                         HOLDER), timeout=30)
        assert started.exit_code == 0
        left_behind = session_of(workdir)
        assert session_members(left_behind)
        marker = tmp_path / "ran"
        probed = probed_run(other, ["touch", str(marker)], timeout=30, lock=OTHER)
        assert probed.result.exit_code == 0 and marker.exists()
        assert session_members(left_behind) == []
        assert holder_record((workdir / LOCK_FILE).read_text())["run"] == "run-two"


@pytest.mark.parametrize("name", ["farm-x86", "local"])
def test_a_lock_file_that_is_a_fifo_is_refused_at_once(name: str, farm, tmp_path: Path) -> None:
    found = local_device() if name == "local" else farm.inventory.get(name)
    device: Device = dataclasses.replace(found, workdir=str(tmp_path / "work"))
    (tmp_path / "work").mkdir()
    os.mkfifo(tmp_path / "work" / LOCK_FILE)  # flock's open of it blocked until the deadline
    marker = tmp_path / "ran"
    with connect(device) as transport, pytest.raises(DeviceError, match="not a regular file"):
        probed_run(transport, ["touch", str(marker)], timeout=600, lock=HOLDER)
    assert not marker.exists()


def forge(workdir: Path, record: dict[str, str]) -> None:
    """Write ``record`` into the lock file (held meanwhile by ``board_lock``), as anyone who
    can write the workdir can."""
    (workdir / LOCK_FILE).write_text("".join(f"{k}={v}\n" for k, v in record.items()))


@pytest.mark.parametrize("name", ["farm-x86", "local"])
def test_a_forged_lock_record_kills_nothing_and_is_reported(name: str, farm,
                                                            tmp_path: Path) -> None:
    found = local_device() if name == "local" else farm.inventory.get(name)
    workdir, elsewhere = tmp_path / "work", tmp_path / "other-work"
    device: Device = dataclasses.replace(found, workdir=str(workdir))
    marker = tmp_path / "ran"
    # a victim's login session, and a real run under another board's lock
    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)
    with connect(dataclasses.replace(found, workdir=str(elsewhere))) as holder, \
            connect(device) as other:
        thread = threading.Thread(target=lambda: holder.run_host(
            locked(["sh", "-c", "sleep 300; echo late"], HOLDER), timeout=600))
        thread.start()
        try:
            run_session = session_of(elsewhere)
            real = holder_record((elsewhere / LOCK_FILE).read_text())
            forged = [
                # the victim's session, a holder that is gone
                {"coordinator": "x", "store": "y", "job": "-", "run": "run-one",
                 "pid": "4000000", "sid": str(victim.pid), "parent": "4000000",
                 "since": "now", "lock_id": "0123456789abcdef"},
                # the other lock's real record, copied: its processes hold another lock file
                {**real, "pid": "4000000", "parent": "4000000"},
            ]
            with board_lock(workdir):
                for record in forged:
                    forge(workdir, record)
                    with pytest.raises(BoardLocked) as refused:
                        probed_run(other, ["touch", str(marker)], timeout=30, lock=OTHER)
                    assert victim.poll() is None and session_members(run_session)
                    message = str(refused.value)
                    assert "not taken over" in message and "nothing was killed" in message, \
                        message
                    assert not abort_run(other, record["run"])  # an abort kills nothing either
                    assert victim.poll() is None and session_members(run_session)
                    assert not marker.exists()
            assert abort_run(holder, "run-one")  # the real run, under its own lock: killed
            assert session_members(run_session) == []
        finally:
            victim.kill()
            victim.wait()
            thread.join(30)
