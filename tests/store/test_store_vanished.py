"""A store that goes away while it is in use. A SQLite file deleted or replaced: every later
commit fails with exit 1 and one line (writes would otherwise go on into the unlinked file and
the run report success), and a coordinator stops before reporting its counts. A PostgreSQL
server that stops: one line and exit 1 (it was a 177-line chained traceback), and a rerun
once it is back completes."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fixtures_db import (
    PostgresCluster,
    add_refs,
    fresh_postgres_database,
    postgres_cluster,
    sample_result,
)
from fixtures_ray import needle_spec, start_cli, stored_runs, wait_for_ok_runs

from db import Store
from db.errors import StoreError


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _pull_the_store(argv: list[str], cwd: Path, store: Store, experiment: str,
                    pull: Callable[[], None]) -> tuple[int, str]:
    """Start the CLI, and once it stored a run ok, ``pull`` its store away; (exit code,
    stderr)."""
    proc = start_cli(argv, cwd)
    try:
        wait_for_ok_runs(proc, store, experiment, 1)
        store.close()
        pull()
        _out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, err


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


def test_a_store_named_through_a_switched_symlink_fails_the_next_commit(tmp_path: Path) -> None:
    first, second, link = tmp_path / "first", tmp_path / "second", tmp_path / "current"
    first.mkdir()
    link.symlink_to(first)
    with Store.open(f"sqlite:///{link}/store.db") as store:
        refs = add_refs(store)
        store.save_run(sample_result(refs, "a" * 64, steps=3))
        second.mkdir()  # a copy of the store behind the new target: the same content
        for suffix in ("", "-wal", "-shm"):
            if Path(f"{first}/store.db{suffix}").exists():
                Path(f"{second}/store.db{suffix}").write_bytes(
                    Path(f"{first}/store.db{suffix}").read_bytes())
        switched = tmp_path / "switched"
        switched.symlink_to(second)
        switched.rename(link)  # the folder the store is named through now leads elsewhere
        with pytest.raises(StoreError) as caught:
            store.save_run(sample_result(refs, "b" * 64, steps=3))
    message = str(caught.value)
    assert caught.value.exit_code == 1 and "\n" not in message
    assert str(second) in message and str(first) in message and "symlink" in message
    with Store.open(f"sqlite:///{first}/store.db") as old:  # nothing went on into the old one
        assert len(old.list_runs("exp")) == 1


def test_run_stops_with_exit_1_when_its_store_is_deleted(ray_address: str, needle_model: Path,
                                                         tmp_path: Path) -> None:
    spec_path = needle_spec(tmp_path, "vanish", needle_model, ["local"],
                            depths=(0.1, 0.4, 0.7, 1.0), extra="cooldown_s = 0.5")
    path = tmp_path / "vanish.db"
    code, err = _pull_the_store(["--db", f"sqlite:///{path}", "run", str(spec_path),
                                 "--ray-address", ray_address], tmp_path,
                                Store.open(f"sqlite:///{path}"), "vanish",
                                lambda: _remove(path))
    assert code == 1, err
    assert "is gone" in err and "Traceback" not in err
    assert "runs in the matrix" not in err  # no success line


@pytest.fixture
def own_postgres() -> Iterator[PostgresCluster]:
    """A PostgreSQL cluster of the test's own, to stop mid-run (the session's is shared)."""
    with postgres_cluster() as cluster:
        yield cluster


def test_postgres_stopping_fails_the_next_write_in_one_line(own_postgres) -> None:
    url = fresh_postgres_database(own_postgres.url)
    with Store.open(url) as store:
        refs = add_refs(store)
        store.save_run(sample_result(refs, "a" * 64, steps=3))
        own_postgres.stop()
        with pytest.raises(StoreError) as caught:
            store.save_run(sample_result(refs, "b" * 64, steps=3))
        assert caught.value.exit_code == 1 and "\n" not in str(caught.value)
        assert "lost the database" in str(caught.value)
        own_postgres.start()  # the store reconnects: the runs before are there, whole
        assert store.completed_run_keys() == {"a" * 64}


def test_run_stops_in_one_line_when_postgres_stops_and_a_rerun_completes(
        ray_address: str, needle_model: Path, tmp_path: Path, own_postgres) -> None:
    spec_path = needle_spec(tmp_path, "pgstop", needle_model, ["local"],
                            depths=(0.1, 0.4, 0.7, 1.0), extra="cooldown_s = 0.5")
    url = fresh_postgres_database(own_postgres.url)
    code, err = _pull_the_store(["--db", url, "run", str(spec_path), "--ray-address",
                                 ray_address, "--lease-ttl", "3"], tmp_path, Store.open(url),
                                "pgstop", own_postgres.stop)
    assert code == 1, err
    errors = [line for line in err.splitlines() if line.startswith("benchfarm: error")]
    assert len(errors) == 1 and "lost the database" in errors[0], err
    assert "Traceback" not in err
    own_postgres.start()
    # nothing is left holding the board: a rerun takes it (once the lease ran out) and finishes
    rerun = start_cli(["--db", url, "run", str(spec_path), "--ray-address", ray_address],
                      tmp_path)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    with Store.open(url) as store:
        assert set(stored_runs(store, "pgstop")["status"]) == {"ok"}
