"""Shared test set-up. Fixtures live in one module per area, loaded here as plugins."""

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = [
    "fixtures_engine",
    "fixtures_arch",
    "fixtures_model",
    "fixtures_farm",
    "fixtures_db",
    "fixtures_ray",
    "fixtures_cluster",
    "fixtures_llama",
    "fixtures_notify",
]


@pytest.fixture(scope="session", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Ray's log files of the runs the tests start (harness.execution.ray_log) go to a folder
    of the session's, not to the user's ~/.local/state: one under pytest's own temporary
    folder (removed at the session's end; after a killed session, pytest's rotation of its
    folders removes it)."""
    folder = tmp_path_factory.mktemp("state")
    before = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(folder)
    try:
        yield folder
    finally:
        if before is None:
            os.environ.pop("XDG_STATE_HOME", None)
        else:
            os.environ["XDG_STATE_HOME"] = before
        shutil.rmtree(folder, ignore_errors=True)
