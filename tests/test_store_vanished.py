"""A SQLite store whose file is deleted or replaced while it is in use: every later commit
fails with exit 1 and one line (writes would otherwise go on into the unlinked file and the
run report success), and a coordinator stops before reporting its counts."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from fixtures_db import add_refs, sample_result
from fixtures_ray import needle_spec, start_cli
from test_coordinator import wait_for_ok_runs

from db import Store
from db.errors import StoreError


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


@pytest.mark.parametrize("replace", [False, True])
def test_a_deleted_or_replaced_file_fails_the_next_commit(tmp_path: Path, replace: bool) -> None:
    path = tmp_path / "store.db"
    with Store.open(f"sqlite:///{path}") as store:
        refs = add_refs(store)
        store.save_run(sample_result(refs, "a" * 64, steps=3))
        _remove(path)
        if replace:
            Store.open(f"sqlite:///{tmp_path}/other.db").close()
            (tmp_path / "other.db").rename(path)
        with pytest.raises(StoreError) as caught:
            store.save_run(sample_result(refs, "b" * 64, steps=3))
    message = str(caught.value)
    assert caught.value.exit_code == 1 and "\n" not in message and str(path) in message
    assert ("replaced" if replace else "is gone") in message


def test_run_stops_with_exit_1_when_its_store_is_deleted(ray_address: str, needle_model: Path,
                                                         tmp_path: Path) -> None:
    spec_path = needle_spec(tmp_path, "vanish", needle_model, ["local"],
                            depths=(0.1, 0.4, 0.7, 1.0), extra="cooldown_s = 0.5")
    path = tmp_path / "vanish.db"
    store = Store.open(f"sqlite:///{path}")
    proc = start_cli(["--db", f"sqlite:///{path}", "run", str(spec_path),
                      "--ray-address", ray_address], tmp_path)
    try:
        wait_for_ok_runs(proc, store, "vanish", 1)
        store.close()
        _remove(path)
        _out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 1, err
    assert "is gone" in err and "Traceback" not in err
    assert "runs in the matrix" not in err  # no success line
