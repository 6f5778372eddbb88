"""Ray and coordinator fixtures: one Ray instance per test session (on a loopback address,
shut down at the end), a private local farm for the coordinator's fault tests, and helpers to
write small specs and read back what the store holds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import ray

from db.measurements import Selection
from db.store import Store
from devices.farm import farm_down, farm_up
from harness.cli import main
from harness.execution.cluster import LOCAL_NODE_IP


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """The GCS address of the session's Ray instance (the driver is this pytest process)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address=LOCAL_NODE_IP, object_store_memory=128 * 1024 * 1024)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@dataclass
class CoordFarm:
    state: Path
    inventory: Path  # farm-x86 (class x86) and farm-arm (class rk3588, emulated)
    pool_inventory: Path  # the same plus `local` in class x86: a pool of two x86 boards

    def restart(self) -> None:
        """Bring stopped nodes back (same keys; the inventories are rewritten)."""
        farm_up(self.state, with_caller=True)
        write_pool_inventory(self)


@pytest.fixture(scope="session")
def coord_farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordFarm]:
    """A farm of its own, so that killing its nodes cannot disturb other tests."""
    state = tmp_path_factory.mktemp("coord-farm")
    inventory = farm_up(state, with_caller=True)  # its nodes end with the session
    pool = state / "pool.toml"
    farm = CoordFarm(state, inventory, pool)
    write_pool_inventory(farm)
    try:
        yield farm
    finally:
        farm_down(state)


def write_pool_inventory(farm: CoordFarm) -> None:
    farm.pool_inventory.write_text(
        farm.inventory.read_text()
        + f'\n[[device]]\nname = "local"\nclass = "x86"\nworkdir = "{farm.state}/local-work"\n')


def needle_spec(folder: Path, name: str, model: Path, devices: list[str], *,
                depths: tuple[float, ...] = (0.5,), k: tuple[int, ...] = (4,),
                ctx: int = 128, extra: str = "", warmups: int = 1) -> Path:
    """A small needle matrix: exact + sparse k for each depth, on ``devices``."""
    path = folder / f"{name}.toml"
    path.write_text(f"""
name = "{name}"
model = "{model}"
devices = {json.dumps(devices)}
warmups = {warmups}
{extra}

[engine.policy.exact]

[engine.policy.sparse]
k = {list(k)}

[[workload]]
kind = "needle"
ctx = {ctx}
depth = {list(depths)}
seed = 0
max_new = 6
""")
    return path


def slow_local_board(folder: Path, seconds: float) -> Path:
    """An inventory whose `local` board sleeps before every command: runs of a known length."""
    inventory = folder / "slow.toml"
    inventory.write_text('[[device]]\nname = "local"\n'
                         f'workdir = "{folder}/work"\n'
                         f'exec_prefix = ["sh", "-c", "sleep {seconds}; exec \\"$0\\" \\"$@\\""]\n')
    return inventory


def stored_runs(store: Store, experiment: str) -> pd.DataFrame:
    """Every stored run of ``experiment`` (an empty frame before it exists)."""
    if experiment not in store.list_experiments():
        return pd.DataFrame(columns=["run_key", "status"])
    return store.frames(experiment)["runs"]


def every_measurement(store: Store, experiment: str) -> pd.DataFrame:
    """Every stored measurement (attempt) of the experiment's runs, by run and attempt."""
    return store.frames(experiment, Selection(all_measurements=True))["runs"]


def as_measured(frame: pd.DataFrame) -> pd.DataFrame:
    """The run and measurement columns of a runs frame (not those of the joined reference
    rows, which later runs refresh: a device's updated_at ...), indexed by measurement id."""
    joined = ("device_", "build_", "model_", "workload_", "experiment")
    own = frame[[c for c in frame.columns if not c.startswith(joined) or c == "experiment_id"]]
    own = own.astype(object).where(own.notna(), None)  # NULL the same in any column's dtype
    return own.set_index("measurement_id").sort_index()


def count_ok(store: Store, experiment: str) -> int:
    runs = stored_runs(store, experiment)
    return int((runs["status"] == "ok").sum())


@dataclass
class StderrWatch:
    """A CLI's stderr, read line by line by a thread of its own; ``seen`` is set at the first
    line holding the marker."""

    lines: list[str]
    seen: threading.Event
    reader: threading.Thread

    @property
    def text(self) -> str:
        return "".join(self.lines)


def watch_stderr(proc: subprocess.Popen, marker: str) -> StderrWatch:
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        try:
            for line in proc.stderr:
                lines.append(line)
                if marker in line:
                    seen.set()
        except ValueError:  # the test closed the stream (communicate) while this read it
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return StderrWatch(lines, seen, reader)


def start_cli(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "BENCHFARM_INVENTORY"}
    # A suite started in the background (`cmd &` in a script) inherits SIGINT ignored, and a
    # Python started with SIGINT ignored keeps ignoring it: the CLI gets the default
    # disposition back here (handlers, unlike ignores, are reset by exec), or Ctrl-C could
    # not reach it
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen([sys.executable, "-m", "harness.cli", *args], cwd=cwd, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def cli_here(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess:
    """A quick `benchfarm` command in this process (a new Python would take seconds)."""
    handler = signal.getsignal(signal.SIGTERM)
    capsys.readouterr()
    try:
        code = main(list(args))
    finally:
        signal.signal(signal.SIGTERM, handler)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def wait_until(proc: subprocess.Popen, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 180
    while not condition():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the coordinator made no progress"
        time.sleep(0.1)


def wait_for_ok_runs(proc: subprocess.Popen, store: Store, experiment: str,
                     wanted: int) -> None:
    """Until ``wanted`` runs are ok."""
    wait_until(proc, lambda: count_ok(store, experiment) >= wanted)
