"""Artifacts by content: what a run uses is named by sha256, never by a path on some node.

The driver knows where each artifact lives on its own machine (the engine binaries it built,
the model directory) and serves them by hash through an ``ArtifactServer`` actor placed on the
driver's node. A board's runner actor, wherever Ray placed it, materialises what a work order
names in a node-local content-addressed cache (``NodeCache``) and pushes from there; the push
to the board is checked against the same hash (``harness.execution.runner``).

Node cache layout (``$BENCHFARM_NODE_CACHE``, default ``~/.cache/benchfarm/node-cache``)::

    blobs/<sha256>             one file per content, read-only, written only after verification
    trees/<sha256>/<relpath>   a model directory: symlinks into blobs/, named by its manifest hash
    refused/<sha256>.<time>    a cached copy that did not match its name, kept for inspection

A cached blob whose content does not match its name (tampered, corrupted) is refused: the run
fails with a message that says so and the copy is moved aside, so the next run fetches it anew.

SSH credentials travel with the board's runner (``harness.execution.credentials``).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import ray

from devices.gc import node_cache_lock
from harness.execution.cluster import NAMESPACE, on_driver_node
from harness.identity import Catalogue, Entry, sha256_file

CHUNK_BYTES = 32 * 1024 * 1024  # one object-store transfer: bounds the memory a fetch takes


class ArtifactError(Exception):
    """An artifact could not be made available on a node as planned; the run fails."""

    exit_code = 1


class ArtifactMismatch(ArtifactError):
    """Bytes that should have had one sha256 have another."""


class ArtifactMissing(ArtifactError):
    """An artifact is neither in a node's cache nor obtainable from the driver."""


def node_name() -> str:
    return ray.util.get_node_ip_address() if ray.is_initialized() else os.uname().nodename


def default_cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("BENCHFARM_NODE_CACHE") or Path(base) / "benchfarm" / "node-cache")


# ---------------------------------------------------------------------------------------------
# The driver's side: the actor that serves the plan's catalogue (harness.identity.Catalogue)
# ---------------------------------------------------------------------------------------------


@ray.remote(num_cpus=0)
class ArtifactServer:
    """Serves the driver's artifacts by hash, in chunks, from the driver's node."""

    def __init__(self, catalogue: Catalogue) -> None:
        self.catalogue = catalogue

    def tree(self, sha256: str) -> tuple[Entry, ...]:
        return self.catalogue.trees[sha256]

    def read(self, sha256: str, offset: int, size: int) -> bytes:
        path = self.catalogue.blobs.get(sha256)
        if path is None:
            raise ArtifactMissing(f"the driver serves no artifact with sha256 {sha256}")
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(size)


def start_server(catalogue: Catalogue, label: str) -> Any:
    """The artifact server, pinned to the driver's own node (where the catalogue's paths are)."""
    return ArtifactServer.options(name=f"artifacts:{label}", namespace=NAMESPACE,
                                  scheduling_strategy=on_driver_node()).remote(catalogue)


# ---------------------------------------------------------------------------------------------
# The node's side: a content-addressed cache filled from the server
# ---------------------------------------------------------------------------------------------


class NodeCache:
    """Materialises artifacts by hash on this node; used inside a board's runner actor."""

    def __init__(self, server: Any, root: Path | None = None, in_flight: int = 2,
                 chunk_bytes: int = CHUNK_BYTES) -> None:
        self.server = server
        self.root = root or default_cache_root()
        # held shared while this cache lives: `benchfarm gc` (of any store) leaves it alone
        self._lock = node_cache_lock(self.root)
        # chunk requests kept in flight: the transfer of one overlaps hashing and writing the
        # one before (bench/artifact_transfer.py compares 1 and 2)
        self.in_flight = in_flight
        self.chunk_bytes = chunk_bytes
        self.node = node_name()
        # blob sha256 -> (inode, size, mtime, ctime) when this process last verified it; any
        # write changes the ctime, so an unchanged signature means unchanged content
        self.verified: dict[str, tuple[int, int, int, int]] = {}

    def blob(self, sha256: str, name: str) -> Path:
        """The path of a verified copy of blob ``sha256`` (fetched from the driver if absent)."""
        path = self.root / "blobs" / sha256
        try:
            st = path.stat()
        except FileNotFoundError:
            return self._fetch(sha256, name, path)
        signature = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if self.verified.get(sha256) != signature:
            got = sha256_file(path)
            if got != sha256:
                self.verified.pop(sha256, None)
                aside = self._refuse(path)
                raise ArtifactMismatch(
                    f"{name}: the copy in the node cache of node {self.node} ({path}) has "
                    f"sha256 {got}, not the planned {sha256}: refused, moved to {aside}; the "
                    "next run fetches it again from the driver")
            self.verified[sha256] = signature
        return path

    def tree(self, sha256: str, name: str) -> Path:
        """A directory of symlinks to verified blobs: the model tree ``sha256``."""
        entries = self._call(self.server.tree, sha256, name=name)
        blobs = {rel: self.blob(sha, f"{name}/{rel}") for rel, sha, _ in entries}
        folder = self.root / "trees" / sha256

        def intact() -> bool:
            return all((folder / rel).resolve() == blob for rel, blob in blobs.items())

        if intact():
            return folder
        tmp = folder.with_name(f"{sha256}.incoming-{secrets.token_hex(4)}")
        for rel, blob in blobs.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).symlink_to(blob)
        try:
            tmp.rename(folder)
        except OSError:  # another runner built it meanwhile (keep that), or a stale one is there
            if intact():
                shutil.rmtree(tmp)
            else:
                shutil.rmtree(folder, ignore_errors=True)
                tmp.rename(folder)
        return folder

    def _fetch(self, sha256: str, name: str, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        incoming = path.with_name(f".incoming-{sha256[:16]}-{secrets.token_hex(4)}")
        digest = hashlib.sha256()
        try:
            with incoming.open("wb") as out:
                # requests past the end return b"": the first empty chunk ends the file
                size = self.chunk_bytes
                ahead = [self.server.read.remote(sha256, i * size, size)
                         for i in range(self.in_flight)]
                offset = self.in_flight * size
                while chunk := self._get(ahead.pop(0), name):
                    ahead.append(self.server.read.remote(sha256, offset, size))
                    offset += size
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != sha256:
                raise ArtifactMismatch(
                    f"{name}: the driver served content with sha256 {digest.hexdigest()} for the "
                    f"planned {sha256}: the file changed on the driver since the run was "
                    "planned; run again to plan with the new content")
            incoming.chmod(0o555)
            incoming.replace(path)
        finally:
            incoming.unlink(missing_ok=True)
        st = path.stat()
        self.verified[sha256] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        return path

    def _call(self, method: Any, *args: Any, name: str) -> Any:
        return self._get(method.remote(*args), name)

    def _get(self, ref: Any, name: str) -> Any:
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as exc:
            cause = getattr(exc, "cause", None) or exc
            raise ArtifactMissing(
                f"artifact {name} is missing on node {self.node}: not in its cache "
                f"{self.root}, and the driver could not provide it ({cause})") from None

    def _refuse(self, path: Path) -> Path:
        aside = self.root / "refused" / f"{path.name}.{time.time_ns()}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        path.replace(aside)
        return aside
