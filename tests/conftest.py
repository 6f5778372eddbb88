"""Shared test set-up. Fixtures live in one module per area, loaded here as plugins."""

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


# Where a run on this machine leaves files that outlive it, each set to a folder of the test
# session's own: Ray's log files (harness.execution.ray_log), the `local` board's workdir and
# the node cache of artifacts. Otherwise the tests would read and write the user's ~/.cache and
# ~/.local/state, and a test of `gc --older-than 1d` would count what earlier sessions left there.
SESSION_FOLDERS = {
    "XDG_STATE_HOME": "state",
    "BENCHFARM_LOCAL_WORKDIR": "local-workdir",
    "BENCHFARM_NODE_CACHE": "node-cache",
}


@pytest.fixture(scope="session", autouse=True)
def session_folders(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Each variable of SESSION_FOLDERS names a folder under pytest's own temporary folder
    while the session runs (removed at its end; after a killed session, pytest's rotation of
    its folders removes them). The llama.cpp build cache stays the machine's: it is what keeps
    a second run of the suite from building llama.cpp again."""
    folders = {name: tmp_path_factory.mktemp(stem) for name, stem in SESSION_FOLDERS.items()}
    try:
        with pytest.MonkeyPatch.context() as patch:  # puts the variables back as they were
            for name, folder in folders.items():
                patch.setenv(name, str(folder))
            yield folders
    finally:
        for folder in folders.values():
            shutil.rmtree(folder, ignore_errors=True)
