"""`benchfarm gc` run against one store while a run of another store uses the board and this
machine's node cache: the store it reads knows nothing of that run, so the board's lock file
and the node cache's lock are what keep the run's files; once the run ends, they go. The real
CLI, a real command holding the board's lock, a real process holding a node cache."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fixtures_farm import old_file, session_of
from fixtures_ray import cli_here

from devices.boardlock import LockHolder, locked
from devices.connect import connect
from devices.inventory import local_device
from harness import REPO_ROOT
from harness.execution.runner import abort_run

OTHER_STORE = LockHolder("elsewhere:1:abc", "sqlite:///their.db", 4, "their-run")
RUNNER = """
import sys, time
from pathlib import Path
from harness.execution.artifacts import NodeCache
cache = NodeCache(None, Path(sys.argv[1]))
print("ready", flush=True)
time.sleep(300)
"""


def test_gc_leaves_what_a_run_of_another_store_uses(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    workdir, node = tmp_path / "work", tmp_path / "node-cache"
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(f'[[device]]\nname = "local"\nworkdir = "{workdir}"\n')
    monkeypatch.setenv("BENCHFARM_NODE_CACHE", str(node))
    board_blob = old_file(workdir / "cache" / ("a" * 64), 1000)
    board_tree = old_file(workdir / "trees" / ("b" * 64) / "config.json", 10).parent
    os.utime(board_tree, (0, 0))
    node_blob = old_file(node / "blobs" / ("c" * 64), 2000)
    gc = ["--db", f"sqlite:///{tmp_path}/ours.db", "gc", "--older-than", "1d",
          "--inventory", str(inventory)]

    device = dataclasses.replace(local_device(), workdir=str(workdir))
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(node)], text=True,
                              stdout=subprocess.PIPE, env={**os.environ,
                                                           "PYTHONPATH": str(REPO_ROOT)})
    with connect(device) as transport:
        thread = threading.Thread(target=lambda: transport.run_host(
            locked(["sleep", "300"], OTHER_STORE), timeout=600))
        thread.start()
        try:
            session_of(workdir)  # the run holds the board's lock
            assert runner.stdout.readline() == "ready\n"  # and a runner the node cache
            done = cli_here(capsys, *gc)
            assert done.returncode == 0, done.stdout + done.stderr
            assert board_blob.exists() and board_tree.exists() and node_blob.exists(), \
                done.stdout
            assert ("local: left alone (its lock file " in done.stdout
                    and "held by coordinator elsewhere:1:abc of store sqlite:///their.db"
                    in done.stdout), done.stdout
            assert f"node cache {node}: left alone (a board runner" in done.stdout
        finally:
            runner.kill()
            runner.wait()
            with connect(device) as aborting:
                abort_run(aborting, "their-run")
            thread.join(30)
    done = cli_here(capsys, *gc)  # the run is over: its old files go
    assert done.returncode == 0 and "total: freed 3000 bytes" in done.stdout, done.stdout
    assert not board_blob.exists() and not board_tree.exists() and not node_blob.exists()
