"""The lock file in a board's workdir (devices.boardlock), held here by a real flock as another
coordinator's command would hold it: over SSH on a farm node and on the local device nothing
runs while it is held; a `benchfarm run` with a store of its own waits, says so, and finishes
once the lock is free."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fixtures_ray import needle_spec, start_cli, stored_runs, watch_stderr

from db.store import Store
from devices.boardlock import LOCK_FILE
from devices.connect import connect
from devices.errors import BoardLocked, DeviceError
from devices.fingerprint import probed_run
from devices.inventory import Device, local_device


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
            probed_run(transport, ["touch", str(marker)], timeout=30, lock=True)
        assert not marker.exists()
        probed = probed_run(transport, ["touch", str(marker)], timeout=30, lock=True)
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
        watch = watch_stderr(proc, "is held by another coordinator")
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
def test_a_lock_file_that_is_a_fifo_is_refused_at_once(name: str, farm, tmp_path: Path) -> None:
    found = local_device() if name == "local" else farm.inventory.get(name)
    device: Device = dataclasses.replace(found, workdir=str(tmp_path / "work"))
    (tmp_path / "work").mkdir()
    os.mkfifo(tmp_path / "work" / LOCK_FILE)  # flock's open of it blocked until the deadline
    marker = tmp_path / "ran"
    with connect(device) as transport, pytest.raises(DeviceError, match="not a regular file"):
        probed_run(transport, ["touch", str(marker)], timeout=600, lock=True)
    assert not marker.exists()
