"""Shared test set-up. Fixtures live in one module per area, loaded here as plugins."""

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


def pytest_configure(config) -> None:
    """Ray's log files of the runs the tests start (harness.execution.ray_log) go to a folder
    of the session's, not to the user's ~/.local/state."""
    import os
    import tempfile

    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="benchfarm-test-state-")


def pytest_unconfigure(config) -> None:
    import os
    import shutil

    shutil.rmtree(os.environ.get("XDG_STATE_HOME", ""), ignore_errors=True)
