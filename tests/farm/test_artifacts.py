"""Artifacts by content on the session's Ray instance and the local farm: the node cache, the
driver's artifact server, the push check, shipped SSH credentials, per-node placement."""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import ray
from fixtures_farm import Farm

from devices.cache import local_sha256
from devices.connect import connect
from devices.inventory import Device
from harness import REPO_ROOT
from harness.errors import InputError
from harness.execution.artifacts import ArtifactMismatch, ArtifactMissing, NodeCache, start_server
from harness.execution.cluster import check_resources
from harness.execution.credentials import Credentials, sweep_abandoned
from harness.execution.runner import PushMemo
from harness.identity import Catalogue


def served(ray_address: str, files: dict[str, bytes], folder: Path) -> tuple[object, dict]:
    """An artifact server for ``files`` (written under ``folder``); returns it and name->sha."""
    catalogue, shas = Catalogue.empty(), {}
    for name, data in files.items():
        path = folder / name
        path.write_bytes(data)
        shas[name] = catalogue.add_file(path, local_sha256(path))
    return start_server(catalogue, f"test-{os.getpid()}-{folder.name}"), shas


def test_node_cache_fetches_by_hash_and_refuses_a_tampered_copy(ray_address: str,
                                                                tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    (tmp_path / "driver").mkdir()
    server, shas = served(ray_address, {"lmc": data}, tmp_path / "driver")
    # 1 MiB chunks, two in flight: the file arrives in four pieces, in order
    cache = NodeCache(server, tmp_path / "node", in_flight=2, chunk_bytes=1 << 20)
    path = cache.blob(shas["lmc"], "engine binary lmc")
    assert path.read_bytes() == data and path.name == shas["lmc"]
    assert cache.blob(shas["lmc"], "engine binary lmc") == path  # cached: no second fetch

    path.chmod(0o644)
    path.write_bytes(b"an ASan build" + data[13:])  # same size, other content
    with pytest.raises(ArtifactMismatch, match="refused") as caught:
        cache.blob(shas["lmc"], "engine binary lmc")
    assert shas["lmc"] in str(caught.value) and "node cache" in str(caught.value)
    refused = list((tmp_path / "node" / "refused").iterdir())
    assert [p.read_bytes()[:13] for p in refused] == [b"an ASan build"]
    # the next use fetches a verified copy again
    assert hashlib.sha256(cache.blob(shas["lmc"], "lmc").read_bytes()).hexdigest() == shas["lmc"]
    ray.kill(server)


def test_a_file_changed_on_the_driver_or_gone_fails_with_its_own_error(
        ray_address: str, tmp_path: Path) -> None:
    (tmp_path / "driver").mkdir()
    server, shas = served(ray_address, {"a": b"planned", "b": b"also planned"},
                          tmp_path / "driver")
    (tmp_path / "driver" / "a").write_bytes(b"rebuilt since")
    cache = NodeCache(server, tmp_path / "node")
    with pytest.raises(ArtifactMismatch, match="changed on the driver since the run was planned"):
        cache.blob(shas["a"], "engine binary a")
    assert not (tmp_path / "node" / "blobs" / shas["a"]).exists()
    (tmp_path / "driver" / "b").unlink()
    with pytest.raises(ArtifactMissing, match=f"artifact model/b is missing on node {cache.node}"):
        cache.blob(shas["b"], "model/b")
    ray.kill(server)


def test_a_model_tree_is_named_as_the_board_names_it_and_a_wrong_push_is_refused(
        ray_address: str, farm: Farm, needle_model: Path, tmp_path: Path) -> None:
    catalogue = Catalogue.empty()
    tree_sha = catalogue.add_tree(needle_model)
    server = start_server(catalogue, f"test-tree-{os.getpid()}")
    local_tree = NodeCache(server, tmp_path / "node").tree(tree_sha, "model needle-tiny")
    for entry in needle_model.iterdir():
        assert (local_tree / entry.name).read_bytes() == entry.read_bytes()
    with connect(farm.x86) as transport:
        pushes = PushMemo(transport)
        remote = pushes.push(local_tree, tree_sha, tree=True)
        assert remote.endswith(f"/trees/{tree_sha}")  # the board's name for the same content
        config = local_tree / "config.json"
        with pytest.raises(ArtifactMismatch, match="refused, the engine was not run"):
            pushes.push(config, "0" * 64)
    ray.kill(server)


def test_ssh_credentials_travel_with_the_device_record(farm: Farm, tmp_path: Path) -> None:
    shipped = Credentials.of(farm.x86)
    assert shipped.key is not None and shipped.known_hosts
    # on "another node": the coordinator's key and known_hosts paths do not exist there
    elsewhere = replace(farm.x86, key=tmp_path / "absent-key",
                        known_hosts=tmp_path / "absent-known-hosts")
    device, folder = shipped.install(elsewhere)
    try:
        assert device.key is not None and device.key.parent == folder
        assert device.key != farm.x86.key and oct(device.key.stat().st_mode & 0o777) == "0o600"
        assert oct(folder.stat().st_mode & 0o777) == "0o700"
        with connect(device) as transport:
            assert transport.run_host(["echo", "reached"], timeout=30).stdout.strip() == \
                "reached"
    finally:
        shutil.rmtree(folder)
    local = farm.inventory.get("local")
    assert Credentials.of(local).install(local) == (local, None)  # no SSH: nothing written


def test_a_killed_runners_credentials_are_removed_by_the_next_install(
        farm: Farm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that installed a board's credentials and died without removing them (a
    runner killed with its coordinator) leaves its folder; the next install on that node
    removes it, and leaves a live process's folder alone."""
    elsewhere = replace(farm.x86, key=tmp_path / "absent-key",
                        known_hosts=tmp_path / "absent-known-hosts")
    shipped = Credentials.of(farm.x86)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # the temporary folder read again: tmp_path
    child = subprocess.run(
        [sys.executable, "-c", "import pickle, sys; shipped, device = pickle.load(sys.stdin."
         "buffer); print(shipped.install(device)[1])"],
        input=pickle.dumps((shipped, elsewhere)), capture_output=True, check=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    left = Path(child.stdout.decode().strip())
    assert left.parent == tmp_path and (left / "id").exists()  # the dead process's copy
    device, folder = shipped.install(elsewhere)
    try:
        assert not left.exists() and folder.exists() and device.key.parent == folder
        assert sweep_abandoned(tmp_path) == []  # this process is alive: its folder stays
        assert folder.exists()
    finally:
        shutil.rmtree(folder)


def test_runners_that_do_not_fit_together_on_a_node_are_refused(ray_address: str) -> None:
    cpus = ray.cluster_resources()["CPU"]
    boards = [Device(name=f"b{i}", arch="x86_64", cls="x86", host="127.0.0.9",
                     resources={"CPU": cpus}) for i in (1, 2)]
    check_resources(boards[:1])
    with pytest.raises(InputError, match=r"device 'b2': key 'resources'.*runners of b1"):
        check_resources(boards)
