"""`benchfarm run` on a real two-node Ray cluster whose worker node cannot see the work tree.

The worker node runs in its own mount namespace with tmpfs over the work tree and the farm's
state (keys, known_hosts): the code reaches it through runtime_env, the engine and the model by
hash through Ray, the SSH credentials with the device records. Boards of the local farm are
pinned to each node by custom resources. The coordinator is the real command line, joining the
cluster with --ray-address and its token. The last test kills the worker node's raylet (a lost
node) and starts the node again.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures_cluster import WORKER_IP, TwoNodeCluster
from fixtures_farm import old_file
from fixtures_ray import CoordFarm, every_measurement, needle_spec, stored_runs

from db.leases import utcnow
from db.store import Store

pytestmark = pytest.mark.usefixtures("two_node_cluster")
DRIVER_TIMEOUT_S = 300


def pinned_inventory(farm: CoordFarm, folder: Path, pins: dict[str, str]) -> Path:
    """The farm's inventory plus `local` (the machine of whichever node hosts its runner), with
    ``resources = {<pin> = 1}`` on each named board."""
    text = farm.inventory.read_text() + \
        f'\n[[device]]\nname = "local"\nworkdir = "{folder}/local-work"\n'
    for name, resource in pins.items():
        text = text.replace(f'name = "{name}"\n',
                            f'name = "{name}"\nresources = {{ {resource} = 1 }}\n')
    path = folder / "pinned.toml"
    path.write_text(text)
    return path


def spec_file(folder: Path, name: str, model: Path) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(f"""
name = "{name}"
model = "{model}"
devices = ["farm-x86", "local"]
warmups = 0

[engine.policy.exact]

[engine.policy.sparse]
k = [4]

[[workload]]
kind = "needle"
ctx = 128
depth = [0.5]
seed = 0
max_new = 4
""")
    return path


def driver(cluster: TwoNodeCluster, folder: Path, *args: str,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`benchfarm --db ... <args> --ray-address <head>`, run from a folder outside the tree."""
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "--db", f"sqlite:///{folder}/farm.db", *args,
         "--ray-address", cluster.address],
        cwd=folder, env=env or cluster.env(), capture_output=True, text=True,
        timeout=DRIVER_TIMEOUT_S)


@pytest.fixture(scope="module")
def pinned(two_node_cluster: TwoNodeCluster, coord_farm: CoordFarm,
           tmp_path_factory: pytest.TempPathFactory) -> Path:
    """farm-x86 (over SSH) from the worker node, `local` on the head node."""
    return pinned_inventory(coord_farm, tmp_path_factory.mktemp("pinned"),
                            {"farm-x86": "node_worker", "local": "node_head"})


def test_matrix_completes_on_both_nodes_then_a_tampered_node_copy_is_refused(
        two_node_cluster: TwoNodeCluster, coord_farm: CoordFarm, pinned: Path,
        needle_model: Path, tmp_path: Path) -> None:
    cluster = two_node_cluster
    spec = spec_file(tmp_path, "two-node", needle_model)
    first = driver(cluster, tmp_path, "run", str(spec), "--inventory", str(pinned))
    assert first.returncode == 0, first.stderr[-3000:]
    store = Store.open(f"sqlite:///{tmp_path}/farm.db")
    runs = stored_runs(store, "two-node")
    assert len(runs) == 4 and set(runs["status"]) == {"ok"}, runs[["status", "error"]]
    assert runs.groupby("device_name").size().to_dict() == {"farm-x86": 2, "local": 2}
    x86 = runs["build_binary_sha256"].iloc[0]
    assert set(runs["build_binary_sha256"]) == {x86}

    # Both nodes materialised the engine and the model from Ray, by hash, in their own caches.
    worker_blobs = cluster.node_cache("worker") / "blobs"
    weights = hashlib.sha256((needle_model / "model.safetensors").read_bytes()).hexdigest()
    for node in ("worker", "head"):
        assert {x86, weights} <= {p.name for p in (cluster.node_cache(node) / "blobs").iterdir()}
    assert (worker_blobs / x86).read_bytes() == Path(_binary_path(store, x86)).read_bytes()

    # Tamper with the worker node's copy of the engine: the next run there refuses it.
    tampered = b"#!/bin/sh\necho '{}'\n"
    blob = worker_blobs / x86
    blob.chmod(0o755)
    blob.write_bytes(tampered)
    second = driver(cluster, tmp_path, "run", str(spec), "--inventory", str(pinned), "--force")
    assert second.returncode == 0, second.stderr[-3000:]
    # --force added a measurement to each run (the first ones stay the runs' ok figures)
    runs = every_measurement(store, "two-node")
    runs = runs[runs["attempt"] == 2]
    failed = runs[runs["status"] == "failed"]
    assert failed["device_name"].tolist() == ["farm-x86"], runs[["status", "error"]]
    error = failed["error"].iloc[0]
    assert "refused" in error and x86 in error and "node cache" in error, error
    assert re.search(r"node 127\.0\.14\.2\b", error), error
    assert (runs["status"] == "ok").sum() == 3
    assert set(stored_runs(store, "two-node")["status"]) == {"ok"}
    # the copy was moved aside, fetched again by hash, and never reached the board
    refused = list((cluster.node_cache("worker") / "refused").iterdir())
    assert [p.read_bytes() for p in refused] == [tampered]
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == x86
    board_cache = coord_farm.state / "nodes" / "farm-x86" / "work" / "cache"
    assert hashlib.sha256(tampered).hexdigest() not in {p.name for p in board_cache.iterdir()}
    store.close()


def _binary_path(store: Store, sha256: str) -> str:
    builds = store.frames("two-node")["runs"]
    return builds.loc[builds["build_binary_sha256"] == sha256, "build_binary"].iloc[0]


def test_two_runners_on_one_node_resource_are_refused_before_anything_runs(
        two_node_cluster: TwoNodeCluster, coord_farm: CoordFarm, needle_model: Path,
        tmp_path: Path) -> None:
    inventory = pinned_inventory(coord_farm, tmp_path,
                                 {"farm-x86": "node_worker", "local": "node_worker"})
    proc = driver(two_node_cluster, tmp_path, "run", str(spec_file(tmp_path, "crowded",
                                                                    needle_model)),
                  "--inventory", str(inventory))
    assert proc.returncode == 2, proc.stderr[-3000:]
    message = proc.stderr.strip().splitlines()[-1]
    assert "'local'" in message and "key 'resources'" in message, message
    assert "'node_worker': 0 left" in message and "farm-x86" in message, message
    assert "Traceback" not in proc.stderr


def test_joining_without_the_clusters_token_names_the_token(
        two_node_cluster: TwoNodeCluster, pinned: Path, needle_model: Path,
        tmp_path: Path) -> None:
    # token mode on, no token: RAY_AUTH_TOKEN unset and no ~/.ray/auth_token in this HOME
    env = two_node_cluster.env(HOME=str(tmp_path))
    env.pop("RAY_AUTH_TOKEN")
    proc = driver(two_node_cluster, tmp_path, "run",
                  str(spec_file(tmp_path, "no-token", needle_model)), "--inventory", str(pinned),
                  env=env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    message = proc.stderr.strip().splitlines()[-1]
    assert "token authentication" in message and "RAY_AUTH_TOKEN" in message, message
    assert "Traceback" not in proc.stderr


def test_gc_nodes_cleans_the_node_cache_of_every_node_of_the_cluster(
        two_node_cluster: TwoNodeCluster, pinned: Path, tmp_path: Path) -> None:
    """An old unreferenced blob in the worker node's cache (a folder only that node's Ray
    workers are told of, by its $BENCHFARM_NODE_CACHE) is reported by --dry-run and removed by
    `gc --nodes --ray-address`; the head node's cache is cleaned by its own task."""
    cluster = two_node_cluster
    worker, head = cluster.node_cache("worker"), cluster.node_cache("head")
    stale = old_file(worker / "blobs" / ("7" * 64), 1234)
    head_stale = old_file(head / "blobs" / ("8" * 64), 766)
    kept = old_file(worker / "blobs" / ("6" * 64), 99, days=0)
    gc = ["gc", "--nodes", "--older-than", "1d", "--inventory", str(pinned)]
    try:
        dry = driver(cluster, tmp_path, *gc, "--dry-run")
        assert dry.returncode == 0, dry.stderr[-3000:]
        assert f"node {WORKER_IP} cache {worker}: 1 blobs, 0 trees; would free 1234 bytes" \
            in dry.stdout, dry.stdout
        assert "total: would free 2000 bytes" in dry.stdout, dry.stdout
        assert stale.exists() and head_stale.exists()
        done = driver(cluster, tmp_path, *gc)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"node {WORKER_IP} cache {worker}: 1 blobs, 0 trees; freed 1234 bytes" \
            in done.stdout, done.stdout
        assert "total: freed 2000 bytes" in done.stdout, done.stdout
        assert not stale.exists() and not head_stale.exists() and kept.exists()
    finally:
        for path in (stale, head_stale, kept):
            path.unlink(missing_ok=True)


def test_a_lost_node_loses_only_its_boards_run_and_a_rerun_after_it_returns_completes(
        two_node_cluster: TwoNodeCluster, coord_farm: CoordFarm, needle_model: Path,
        tmp_path: Path) -> None:
    """The worker node's raylet is killed while its board (farm-arm) has a run in flight: the
    head node's board (farm-x86) finishes its runs, the lost run is stored `lost`, the driver
    exits 1 with its summary (no traceback); once the node is back a rerun does the rest."""
    cluster = two_node_cluster
    inventory = pinned_inventory(coord_farm, tmp_path,
                                 {"farm-x86": "node_head", "farm-arm": "node_worker"})
    spec = needle_spec(tmp_path, "lost-node", needle_model, ["farm-x86", "farm-arm"],
                       depths=(0.3, 0.7), warmups=0)
    url = f"sqlite:///{tmp_path}/farm.db"
    store = Store.open(url)
    args = [sys.executable, "-m", "harness.cli", "--db", url, "run", str(spec), "--inventory",
            str(inventory), "--ray-address", cluster.address]
    proc = subprocess.Popen(args, cwd=tmp_path, env=cluster.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + DRIVER_TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:
            lease = store.leases.get("farm-arm")
            if lease is not None and lease.run_key is not None and lease.expires > utcnow():
                break  # an arm run is in flight on the worker node
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        in_flight = lease.run_key
        cluster.kill_worker_raylet()
        out, err = proc.communicate(timeout=DRIVER_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err[-3000:]
    # Ray's own log lines (the raylet's, prefixed "(raylet)", e.g. "RpcError: ... Socket
    # closed" as it notices the dead node) are not ours; every other line must be clean
    ours = [line for line in out.splitlines() if "(raylet)" not in line]
    assert "Traceback" not in err and not [line for line in ours if "Error:" in line], out
    assert "1 lost" in out, out
    runs = stored_runs(store, "lost-node")
    x86, arm = (runs[runs["device_name"] == name] for name in ("farm-x86", "farm-arm"))
    assert len(x86) == 4 and set(x86["status"]) == {"ok"}, x86[["status", "error"]]
    lost = arm[arm["status"] == "lost"]
    # the run in flight when the raylet died: the one the lease named a moment before, or the
    # next one if that one ended while the kill took effect (one lost either way)
    assert len(lost) == 1, arm[["status", "error"]]
    assert lost["run_key"].iloc[0] in set(arm["run_key"]) and in_flight in set(arm["run_key"])
    assert "runner was lost" in lost["error"].iloc[0]
    assert set(arm["status"]) <= {"ok", "lost", "pending"}

    cluster.stop_worker()  # what is left of the node
    cluster.start_worker()
    rerun = driver(cluster, tmp_path, "run", str(spec), "--inventory", str(inventory))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    final = stored_runs(store, "lost-node")
    store.close()
    assert len(final) == 8 and final["run_key"].is_unique and set(final["status"]) == {"ok"}
