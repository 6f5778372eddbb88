"""Running a lab: board states and reservations, job ids and owners, notifications, all on the
real CLI, the real store and (for the lost board and the drained serve) the real engine, Ray
and farm."""

from __future__ import annotations

import getpass
import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from fixtures_farm import old_file
from fixtures_notify import Receiver
from fixtures_ray import cli_here, count_ok, needle_spec, start_cli, stored_runs

from db.store import Store
from devices.inventory import device_table, load_inventory
from harness.errors import InputError
from harness.execution.coordinator import Coordinator
from harness.execution.notify import Targets, notify
from harness.lab.serving import Service
from harness.spec import parse_spec


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    done = cli_here(capsys, *args)
    return done.returncode, done.stdout, done.stderr


def test_states_reservations_and_job_ids(tmp_path: Path, needle_model: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    db = ["--db", f"sqlite:///{tmp_path}/lab.db"]
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(f'[[device]]\nname = "local"\nworkdir = "{tmp_path}/work"\n')
    spec = str(needle_spec(tmp_path, "lab-demo", needle_model, ["local"]))
    inv = ["--inventory", str(inventory)]

    assert cli(capsys, *db, "devices", "state", "local", "maintenance", "--reason",
               "new fan")[0] == 0
    code, out, _ = cli(capsys, *db, "devices", "list", *inv)
    assert code == 0 and "maintenance  new fan" in out
    code, _, err = cli(capsys, *db, "run", spec, *inv)  # refused before Ray starts
    assert code == 2 and "board 'local' is maintenance (new fan)" in err
    assert cli(capsys, *db, "devices", "state", "local", "online")[0] == 0
    code, out, _ = cli(capsys, *db, "devices", "health", "local", *inv)
    me = getpass.getuser()
    assert code == 0 and out.count(f"{me}") == 2 and "maintenance  new fan" in out

    assert cli(capsys, *db, "reserve", "local", "--for", "1h", "--reason", "demo",
               "--owner", "ann", *inv)[0] == 0
    assert "reserved by ann" in cli(capsys, *db, "queue")[1]
    code, _, err = cli(capsys, *db, "run", spec, *inv)
    assert code == 2 and "reserved by ann" in err
    assert cli(capsys, *db, "submit", spec, *inv)[0] == 0  # job 1: waits for the board
    with Store.open(db[1]) as store:  # what a serve sees: ann's job may go, mine waits
        service = Service(store, load_inventory(inventory), Coordinator(), Targets(), None)
        assert service.claim() is None  # job 1 waits, and says why
        anns = store.jobs.add("lab-demo", spec, Path(spec).read_text(), owner="ann")
        assert service.claim().id == anns == 2
        assert store.jobs.cancel(anns, "ann", "not needed")
        waited = [e for e in store.jobs.events(1) if e.event == "waiting"]
        assert len(waited) == 1  # said once, though asked twice
        assert waited[0].cause.startswith("waiting: board 'local' is reserved by ann")
    assert "waiting: board 'local' is reserved by ann" in cli(capsys, *db, "queue")[1]
    code, _, err = cli(capsys, *db, "release", "local", *inv)  # ann's: an admin says so
    assert code == 2 and "belongs to ann" in err and "--force" in err
    assert "released (was reserved for ann)" in cli(capsys, *db, "release", "local", "--force",
                                                    *inv)[1]

    code, _, err = cli(capsys, *db, "submit", spec, "--devices", "nosuch", *inv)
    assert code == 2 and "nosuch" in err
    anns = cli(capsys, *db, "submit", spec, "--owner", "ann", *inv)[1]
    assert anns.startswith("queued job 3:")
    code, _, err = cli(capsys, *db, "cancel", "lab-demo")
    assert code == 2 and "job 1 (queued" in err and "job 3 (queued, owner ann)" in err
    code, _, err = cli(capsys, *db, "cancel", "3")
    assert code == 2 and "belongs to ann" in err
    assert cli(capsys, *db, "cancel", "3", "--force")[0] == 0
    assert cli(capsys, *db, "wait", "3")[0] == 3
    code, out, _ = cli(capsys, *db, "logs", "3")
    assert code == 0 and f"cancelled by {me}" in out and "the owner is ann" in out
    assert cli(capsys, *db, "cancel", "lab-demo")[0] == 0  # one active job left: mine
    assert cli(capsys, *db, "wait", "1")[0] == 3

    assert cli(capsys, *db, "devices", "state", "local", "retired")[0] == 0
    code, _, err = cli(capsys, *db, "submit", spec, *inv)
    assert code == 2 and "board 'local' is retired" in err


def test_notify_posts_json_and_runs_a_command(receiver: Receiver, tmp_path: Path) -> None:
    out = tmp_path / "event.json"
    event = {"event": "job-end", "job": 7, "state": "done"}
    closed = "http://127.0.0.1:9/nobody"
    problems = notify(event, Targets([receiver.url, closed], [f"cat > {out}"]))
    assert receiver.events == [event] and json.loads(out.read_text()) == event
    assert len(problems) == 1 and problems[0].startswith(f"notify {closed}")
    with pytest.raises(InputError, match=r"'notify\.urls': unknown key; allowed: command, url"):
        parse_spec('name = "n"\n[notify]\nurls = "http://127.0.0.1:1/"\n[[workload]]\n'
                   'kind = "attn-bench"\nctx = 64\nheads = 2\nkv_heads = 1\nhead_dim = 16\n',
                   tmp_path / "n.toml")


def test_a_board_lost_n_times_goes_bad_and_is_announced(
        farm, ray_address: str, needle_model: Path, receiver: Receiver, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    text = farm.inventory_path.read_text().replace(f"port = {farm.x86.port}\n", "port = 9\n")
    inventory = tmp_path / "closed.toml"
    inventory.write_text(text.replace("connect_retries = 2", "connect_retries = 1"))
    spec = needle_spec(tmp_path, "lab-lost", needle_model, ["farm-x86"],
                       extra="retries = 4\nbackoff_s = 0.05")
    url = f"sqlite:///{tmp_path}/lost.db"
    code, out, err = cli(capsys, "--db", url, "run", str(spec), "--inventory", str(inventory),
                         "--ray-address", ray_address, "--notify", receiver.url,
                         "--bad-after", "2")
    assert code == 1, err
    with Store.open(url) as store:
        status = store.boards.states(["farm-x86"])["farm-x86"]
        runs = stored_runs(store, "lab-lost")
    assert status.state == "bad" and status.reason.startswith("2 runs lost in a row")
    assert set(runs["status"]) == {"pending"} and "is bad" in runs["error"].iloc[0]
    kinds = [e["event"] for e in receiver.events]
    assert kinds == ["board-bad", "job-end"], receiver.events
    assert receiver.events[0]["board"] == "farm-x86"
    assert receiver.events[1]["state"] == "failed" and out.startswith("job 1: ")


def test_maintenance_drains_a_serve_and_online_resumes_it(
        ray_address: str, needle_model: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/drain.db"
    inventory = tmp_path / "slow.toml"  # `local`, one second longer per command
    inventory.write_text('[[device]]\nname = "local"\n'
                         f'workdir = "{tmp_path}/work"\n'
                         'exec_prefix = ["sh", "-c", "sleep 1; exec \\"$0\\" \\"$@\\""]\n')
    events = tmp_path / "events.jsonl"  # the serve operator's --notify command appends each
    spec = needle_spec(tmp_path, "lab-drain", needle_model, ["local"], depths=(0.2, 0.8))
    db, inv = ["--db", url], ["--inventory", str(inventory)]
    assert cli(capsys, *db, "submit", str(spec), *inv)[0] == 0
    store = Store.open(url)
    serve = start_cli([*db, "serve", "--ray-address", ray_address, "--poll", "0.2", *inv,
                       "--notify", f"cat >> {events}; echo >> {events}"], tmp_path)
    try:
        deadline = time.monotonic() + 240
        while not any(lease.run_key for lease in store.leases.active()):
            assert time.monotonic() < deadline and serve.poll() is None, "no run started"
            time.sleep(0.05)
        assert cli(capsys, *db, "devices", "state", "local", "maintenance", "--reason",
                   "drain test")[0] == 0
        while store.jobs.get(1).state != "queued":
            assert time.monotonic() < deadline and serve.poll() is None, "job not requeued"
            time.sleep(0.1)
        drained = stored_runs(store, "lab-drain")
        assert set(drained["status"]) == {"ok", "pending"}, drained[["status", "error"]]
        time.sleep(2)  # the serve keeps the job queued: nothing more runs
        assert count_ok(store, "lab-drain") == int((drained["status"] == "ok").sum())
        queue = cli(capsys, *db, "queue")[1]
        assert "waiting: board 'local' is maintenance (drain test)" in queue
        assert cli(capsys, *db, "devices", "state", "local", "online")[0] == 0
        while store.jobs.get(1).state != "done":
            assert time.monotonic() < deadline and serve.poll() is None, "job not resumed"
            time.sleep(0.1)
    finally:
        if serve.poll() is None:
            os.kill(serve.pid, signal.SIGTERM)
        try:
            printed = serve.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            serve.kill()
            raise
    final = stored_runs(store, "lab-drain")
    [check] = store.boards.health("local")  # scheduled by the serve before its first job
    story = store.jobs.events(1)
    attempts = store.jobs.attempts(1)
    store.close()
    assert len(final) == 4 and final["run_key"].is_unique and set(final["status"]) == {"ok"}
    assert check.ok and check.checked_by.count(":") == 2  # the serve's holder id
    [ended] = [json.loads(line) for line in events.read_text().splitlines() if line]
    assert ended["event"] == "job-end" and ended["state"] == "done" and ended["job"] == 1
    # typed counts (its attempts: the 4 ok, and those the drain left pending) and zoned times
    assert ended["counts"]["ok"] == 4 and isinstance(ended["counts"]["pending"], int)
    assert ended["counts"]["pending"] == sum(a.status == "pending" for a in attempts)
    assert ended["matrix_runs"] == 4 and ended["finished_at"].endswith("+00:00")
    # its story: claimed, drained by the maintenance, waiting for it, claimed again, finished
    assert [e.event for e in story] == ["submitted", "claimed", "drained", "waiting", "claimed",
                                        "finished"], story
    assert story[1].actor == story[4].actor == check.checked_by  # by this serve
    assert "maintenance (drain test)" in story[3].cause
    assert [a.status for a in attempts].count("ok") == 4
    # every line the serve printed starts with its UTC time
    lines = printed.splitlines()
    assert lines and all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ", line)
                         for line in lines), printed


def test_gc_cleans_the_other_boards_when_one_cannot_be_reached(
        farm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    x86 = farm.inventory.devices["farm-x86"]
    gone = {"name": "farm-gone", "host": "127.0.0.1", "port": closed, "arch": x86.arch,
            "user": x86.user, "key": str(x86.key), "workdir": str(tmp_path / "gone")}
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(farm.inventory_path.read_text() + device_table(gone))
    stale = old_file(Path(x86.workdir) / "cache" / ("7" * 64), 1234)
    monkeypatch.setenv("BENCHFARM_NODE_CACHE", str(tmp_path / "node-cache"))
    try:
        code, out, err = cli(capsys, "--db", f"sqlite:///{tmp_path}/gc.db", "gc", "--older-than",
                             "1d", "--inventory", str(inventory), "farm-gone", "farm-x86")
    finally:
        stale.unlink(missing_ok=True)
    assert code == 1, out + err
    assert "farm-gone: failed, nothing removed there: " in out and str(closed) in out
    assert "farm-x86: 1 blobs, 0 trees; freed 1234 bytes" in out
    assert "total: freed 1234 bytes; 1 failed" in out


def test_gc_frees_old_unreferenced_artifacts_but_not_what_a_job_needs(
        farm, needle_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    x86, arm = Path(farm.x86.workdir), Path(farm.arm.workdir)
    stale = old_file(x86 / "cache" / ("a" * 64), 1000)
    linked = old_file(x86 / "cache" / ("b" * 64), 500)
    fresh = old_file(x86 / "cache" / ("c" * 64), 300, days=0)
    tree = x86 / "trees" / ("d" * 64)
    tree.mkdir(parents=True)
    (tree / "model.safetensors").symlink_to(linked)  # a tree made now keeps its blob
    old_tree = old_file(x86 / "trees" / ("e" * 64) / "config.json", 10).parent
    os.utime(old_tree, (time.time() - 3 * 86400,) * 2)
    needed = old_file(arm / "cache" / ("f" * 64), 700)  # a queued job's board: left alone
    node = tmp_path / "node-cache"
    monkeypatch.setenv("BENCHFARM_NODE_CACHE", str(node))
    node_blob = old_file(node / "blobs" / ("9" * 64), 2000)
    db = ["--db", f"sqlite:///{tmp_path}/gc.db"]
    inv = ["--inventory", str(farm.inventory_path)]
    spec = needle_spec(tmp_path, "gc-arm", needle_model, ["farm-arm"])
    assert cli(capsys, *db, "submit", str(spec), *inv)[0] == 0
    try:
        code, out, _ = cli(capsys, *db, "gc", "--dry-run", "--older-than", "1d", *inv)
        assert code == 0 and "total: would free 3000 bytes" in out and stale.exists()
        code, out, _ = cli(capsys, *db, "gc", "--older-than", "1d", *inv)
        assert code == 0 and "total: freed 3000 bytes" in out, out
        assert "farm-arm: left alone (job 1 (gc-arm) is queued)" in out
        assert not stale.exists() and not node_blob.exists() and not old_tree.exists()
        assert linked.exists() and fresh.exists() and tree.exists() and needed.exists()
    finally:
        for path in (linked, fresh, needed):
            path.unlink(missing_ok=True)
        (tree / "model.safetensors").unlink()
        tree.rmdir()
