"""The local farm's life cycle (up, status, down, stale state) and a node dying mid-run.

Each test starts its own farm: they kill and restart nodes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fixtures_farm import start_farm

from devices import procs
from devices.connect import connect
from devices.errors import DeviceUnreachable
from devices.farm import NODES, farm_down, farm_status, farm_up, stop_node
from harness.cli import main

# the farm's nodes: an x86 node, an emulated RK3588 (Cortex-A76) and an emulated Cortex-A72
NODE_NAMES = {node.name for node in NODES}


def pids(state_dir: Path) -> dict[str, int | None]:
    return {node.name: node.pid for node in farm_status(state_dir) if node.running}


def test_up_is_idempotent_and_down_stops_exactly_its_processes(tmp_path: Path) -> None:
    farm = start_farm(tmp_path)
    first = pids(tmp_path)
    assert set(first) == NODE_NAMES == {"farm-x86", "farm-arm", "farm-a72"}
    assert farm_up(tmp_path) == farm.inventory_path
    assert pids(tmp_path) == first  # nothing restarted

    with connect(farm.x86):  # an open session: its sshd children must go down too
        session_children = procs.descendants(first["farm-x86"])
        assert session_children
        bystander = subprocess.Popen(["sleep", "300"])  # not the farm's: must survive
        try:
            stopped = farm_down(tmp_path)
            assert set(first.values()) <= set(stopped)
            assert bystander.pid not in stopped
            assert not any(procs.alive(p) for p in [*stopped, *session_children])
            assert bystander.poll() is None
        finally:
            bystander.kill()
            bystander.wait()
    assert pids(tmp_path) == {}
    assert farm_down(tmp_path) == []  # a second down has nothing to stop


def test_stale_state_dir_is_recovered_and_recycled_pids_are_not_killed(tmp_path: Path) -> None:
    farm = start_farm(tmp_path)
    ports = {n.name: n.port for n in farm_status(tmp_path)}
    for name in NODE_NAMES:
        stop_node(tmp_path, name, signal.SIGKILL)  # as if the machine had rebooted
    assert pids(tmp_path) == {}

    farm_up(tmp_path, with_caller=True)
    assert {n.name: n.port for n in farm_status(tmp_path)} == ports  # same addresses again
    with connect(farm.arm) as t:
        assert t.run_host(["echo", "back"], timeout=30).stdout == "back\n"

    # A state file whose pid now belongs to someone else (start time differs) is left alone.
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        farm_down(tmp_path)
        state = {"nodes": {"farm-x86": {"name": "farm-x86", "address": "127.0.1.10",
                                        "port": ports["farm-x86"], "pid": bystander.pid,
                                        "start_ticks": 1}}}
        (tmp_path / "farm.json").write_text(json.dumps(state))
        assert [n.running for n in farm_status(tmp_path)] == [False] * len(NODE_NAMES)
        assert farm_down(tmp_path) == []
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_up_restarts_a_node_whose_config_is_outdated(tmp_path: Path) -> None:
    farm = start_farm(tmp_path)
    try:
        first = pids(tmp_path)
        ports = {n.name: n.port for n in farm_status(tmp_path)}
        config = tmp_path / "nodes" / "farm-arm" / "sshd_config"
        config.write_text(config.read_text().replace("SetEnv SHLVL=1\n", ""))  # an older farm
        farm_up(tmp_path, with_caller=True)
        now = pids(tmp_path)
        assert now["farm-x86"] == first["farm-x86"] and now["farm-arm"] != first["farm-arm"]
        assert not procs.alive(first["farm-arm"])
        assert {n.name: n.port for n in farm_status(tmp_path)} == ports
        assert "SetEnv SHLVL=1" in config.read_text()
        with connect(farm.arm) as t:
            assert t.run_host(["sh", "-c", "echo $SHLVL"], timeout=30).stdout == "1\n"
    finally:
        farm_down(tmp_path)


def test_sshd_killed_during_a_run_raises_a_typed_error_without_hanging(tmp_path: Path) -> None:
    farm = start_farm(tmp_path)
    started = Path(farm.x86.workdir) / "started"
    try:
        with connect(farm.x86) as t:
            def kill_when_started() -> None:
                deadline = time.monotonic() + 60
                while not started.exists() and time.monotonic() < deadline:
                    time.sleep(0.02)
                stop_node(tmp_path, "farm-x86", signal.SIGKILL)

            killer = threading.Thread(target=kill_when_started, daemon=True)
            killer.start()
            # The command's own timeout is far away: the error must come from the lost link,
            # not from the timeout (CommandTimeout would fail this test).
            with pytest.raises(DeviceUnreachable) as info:
                t.run(["sh", "-c", "touch started && exec sleep 600"], timeout=600)
            killer.join(timeout=60)
            assert "farm-x86" in str(info.value) and "lost" in str(info.value)

            # The node comes back on the same address; the same transport reconnects.
            farm_up(tmp_path, with_caller=True)
            assert t.run(["echo", "reconnected"], timeout=30).stdout == "reconnected\n"
    finally:
        farm_down(tmp_path)


def test_farm_cli_up_status_down(tmp_path: Path, capsys) -> None:
    state = str(tmp_path / "state")
    assert main(["farm", "up", "--state", state]) == 0
    out = capsys.readouterr().out
    assert f"inventory: {tmp_path / 'state' / 'inventory.toml'}" in out
    assert out.count("running (pid") == len(NODE_NAMES)
    try:
        assert main(["devices", "list", "--inventory", f"{state}/inventory.toml", "rk3588"]) == 0
        listing = capsys.readouterr().out
        assert "farm-arm" in listing and "farm-x86" not in listing and "yes" in listing
        assert main(["farm", "status", "--state", state]) == 0
        assert capsys.readouterr().out.count("running") == len(NODE_NAMES)
    finally:
        assert main(["farm", "down", "--state", state]) == 0
    assert "stopped" in capsys.readouterr().out
    assert main(["farm", "status", "--state", state]) == 1
    assert capsys.readouterr().out.count("stopped") == len(NODE_NAMES)


def test_concurrent_ups_start_one_farm(tmp_path: Path) -> None:
    code = "import sys; from devices.farm import farm_up; print(farm_up(sys.argv[1]))"
    procs_up = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)],
                                 stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        outputs = [p.communicate(timeout=120)[0].strip() for p in procs_up]
        assert [p.returncode for p in procs_up] == [0, 0]
        assert outputs == [str(tmp_path / "inventory.toml")] * 2
        running = pids(tmp_path)
        assert set(running) == NODE_NAMES
        sshds = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
                 if str(tmp_path) in _cmdline(pid)]
        assert sorted(sshds) == sorted(running.values())  # no second, orphaned pair
    finally:
        farm_down(tmp_path)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_a_state_dir_with_a_space_and_a_percent_works(tmp_path: Path) -> None:
    state = tmp_path / "my farm 100%"
    farm = start_farm(state)
    try:
        with connect(farm.x86) as t:
            assert t.run(["echo", "up"], timeout=30).stdout == "up\n"
    finally:
        farm_down(state)
    assert pids(state) == {}


def test_after_farm_down_the_default_inventory_leaves_the_farm_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The default inventory is the farm's only while the farm is up: afterwards no command
    tries its boards (gc --dry-run exited 1 reaching them)."""
    monkeypatch.chdir(tmp_path)  # the default state folder, ./farm-state, is made here
    monkeypatch.delenv("BENCHFARM_INVENTORY", raising=False)
    db = f"sqlite:///{tmp_path}/gc.db"
    assert main(["farm", "up"]) == 0
    try:
        assert main(["devices", "list"]) == 0
        assert "farm-x86" in capsys.readouterr().out
    finally:
        assert main(["farm", "down"]) == 0
    assert "the default inventory is the built-in one (local only)" in capsys.readouterr().out
    assert main(["devices", "list"]) == 0
    listing = capsys.readouterr().out
    assert "local" in listing and "farm-x86" not in listing and "farm-arm" not in listing
    assert main(["--db", db, "gc", "--boards", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "farm-" not in out and "failed" not in out


def test_a_session_farm_ends_with_its_killed_session(tmp_path: Path) -> None:
    """A test session's farm (``with_caller``, as the fixtures start it) does not outlive the
    session even when it is SIGKILLed, which runs no clean-up: a stand-in session starts the
    farm the same way, says so, waits, and is killed; its sshds end after it."""
    code = ("import sys, time; from devices.farm import farm_up; "
            "farm_up(sys.argv[1], with_caller=True); print('up', flush=True); time.sleep(600)")
    session = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert session.stdout is not None and session.stdout.readline() == "up\n"
        started = pids(tmp_path)
        assert set(started) == NODE_NAMES
        session.kill()
        session.wait(timeout=60)
        deadline = time.monotonic() + 60  # generous: a loaded machine; not a speed check
        while pids(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pids(tmp_path) == {}, "the farm's sshds outlived the killed session"
        assert not any(procs.alive(pid) for pid in started.values())
    finally:
        session.kill()
        farm_down(tmp_path)
