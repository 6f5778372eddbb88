"""The commands that only read a SQLite store answer while another process holds its write
lock (a coordinator storing a run): their transactions stay deferred, and WAL lets a reader
read the last commit beside a writer. Opened for writing, each would first wait out the busy
timeout for that lock, then fail with "database is locked"."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from fixtures_reports import SyntheticExperiment

from db import Store
from harness.cli import main


def test_status_runs_queue_and_alerts_read_beside_a_held_write_lock(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "busy.db"
    url = f"sqlite:///{path}"
    with Store.open(url) as store:
        experiment = SyntheticExperiment(store, name="night", spec_text='name = "night"\n')
        for repeat in range(3):
            experiment.run(ctx=256, repeat=repeat)
    coordinator = sqlite3.connect(path, isolation_level=None)
    try:
        coordinator.execute("BEGIN IMMEDIATE")  # the write lock, held as a long insert would
        coordinator.execute("UPDATE experiments SET spec_text = spec_text")
        capsys.readouterr()
        assert main(["--db", url, "status"]) == 0
        assert "night" in capsys.readouterr().out
        assert main(["--db", url, "runs", "list", "--experiment", "night"]) == 0
        assert capsys.readouterr().out.count(" ok ") == 3
        assert main(["--db", url, "queue"]) == 0
        assert main(["--db", url, "alerts", "list"]) == 0
        capsys.readouterr()
    finally:
        coordinator.execute("ROLLBACK")
        coordinator.close()
