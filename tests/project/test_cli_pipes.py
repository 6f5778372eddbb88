"""`benchfarm ... | head`: a reader that goes away early ends the command quietly, with the
status of a filter killed by SIGPIPE, never with a BrokenPipeError traceback. The pipe's
read end is closed before the command starts, so every write it makes finds no reader."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from db.store import Store
from harness.cli import CLOSED_PIPE

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("argv", "code"), [
    # argparse itself ignores a failed write of a help, which then exits 0
    (["--help"], 0), (["status", "--help"], 0),
    (["queue"], CLOSED_PIPE), (["status"], CLOSED_PIPE), (["devices", "list"], CLOSED_PIPE)])
def test_a_closed_pipe_ends_a_command_quietly(argv: list[str], code: int, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/pipe.db"
    Store.open(db).close()
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line is written
    try:
        proc = subprocess.run([sys.executable, "-m", "harness.cli", "--db", db, *argv],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    finally:
        os.close(write_end)
    assert proc.stderr == "" and proc.returncode == code, proc.stderr
