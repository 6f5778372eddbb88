"""A run's token ids reach the engine on its standard input through a file of the run's own,
which is gone when the run is over (a long-lived coordinator used to leave one per prompt)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from devices.boardlock import LockHolder
from devices.connect import connect
from devices.inventory import Device
from harness.contract import WorkOrder
from harness.execution.runner import PushMemo, execute, scratch_dir, write_ids


def test_the_ids_reach_the_engine_and_their_file_is_removed(tmp_path: Path) -> None:
    received = tmp_path / "received"
    binary = tmp_path / "engine.sh"  # stands for the engine: it keeps what it read
    binary.write_text(f"#!/bin/sh\ncat > {received}\n")
    binary.chmod(0o755)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    board = Device(name="here", arch="x86_64", cls="x86", transport="local",
                   workdir=str(tmp_path / "work"))
    order = WorkOrder(run_key="k" * 64, label="ids", engine="lmc", command="generate",
                      binary=str(binary),
                      binary_sha256=hashlib.sha256(binary.read_bytes()).hexdigest(),
                      model_dir=None, model_sha256=None, ids=(151644, 872, 198), options=(),
                      timeout_s=30.0, warmup=True)
    holder = LockHolder("test:1:x", "sqlite:///none", None, order.run_key)
    with connect(board) as transport:
        pushes = PushMemo(transport)
        for _ in range(2):  # the same prompt twice: each run writes and removes its own file
            execute(order, board.name, pushes, scratch, holder)
            assert received.read_text().split() == ["151644", "872", "198"]
            assert list(scratch.iterdir()) == []
            received.unlink()


def test_the_id_files_of_dead_processes_go_when_a_runner_next_takes_the_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner killed mid-run leaves its file: the next runner on the node removes it, and
    keeps the files of processes still alive (their runs may be reading them)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = scratch_dir()
    dead = subprocess.Popen(["true"])  # a process id that is no longer alive
    dead.wait()
    left = folder / f"ids-{dead.pid}-abcd1234.txt"
    mine = write_ids((1, 2), folder)
    left.write_text("1 2\n")
    assert scratch_dir() == folder
    assert not left.exists() and mine.exists()
    assert mine.name.startswith(f"ids-{os.getpid()}-")
