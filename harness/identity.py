"""What names an artifact: every hash the harness computes, in one place.

A run is named by the content of what it uses, never by a path: the engine binary (the sha256
of the file), the engine's sources (``files_hash``), the model's weights (``weights_sha256``:
one file, or a sharded checkpoint's index and shards), the model folder as the boards cache it
(its manifest hash, ``devices.cache``), a policy's file (gbm's trees). The same content gets the
same name in run keys, in the store, and in the nodes' and boards' caches.

``Catalogue`` lists the artifacts of a plan by those names, with where the driver has them; the
driver serves them from it (``harness.execution.artifacts``).

A spec's ``revisions`` name git revisions of this repository (or ``worktree``, the working
tree): an engine built from a folder of it (its adapter's ``source_paths``) is named by the
commit, with ``+dirty`` when that folder has local changes.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devices.cache import tree_manifest, tree_sha256
from harness import REPO_ROOT
from harness.errors import InputError

Entry = tuple[str, str, int]  # a tree's file: (relative path, sha256, size)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def files_hash(paths: list[Path]) -> str:
    """sha256 over the names and contents of ``paths``, in name order."""
    digest = hashlib.sha256()
    for path in sorted(paths, key=lambda p: p.name):
        digest.update(path.name.encode() + b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def weights_sha256(model_dir: Path) -> str:
    """The identity of a model's weights: the sha256 of model.safetensors, or for a sharded
    checkpoint the sha256 of the lines "NAME SHA256" of its index and then of each shard (by
    name), so a change to any shard or to the index changes it."""
    single = model_dir / "model.safetensors"
    if single.is_file():
        return sha256_file(single)
    index = model_dir / "model.safetensors.index.json"
    if not index.is_file():
        raise InputError(f"model {model_dir}: neither model.safetensors nor "
                         "model.safetensors.index.json")
    try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{index}: no readable 'weight_map' ({exc!r})") from exc
    digest = hashlib.sha256()
    for name in [index.name, *shards]:
        if not isinstance(name, str) or "/" in name or not (model_dir / name).is_file():
            raise InputError(f"{index}: shard {name!r} is not a file in {model_dir}")
        digest.update(f"{name} {sha256_file(model_dir / name)}\n".encode())
    return digest.hexdigest()


def model_identity(model_dir: Path) -> tuple[str, dict[str, Any]]:
    """The weights' sha256 and the model's config.json."""
    sha = weights_sha256(model_dir)
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"model {model_dir}: unreadable config.json ({exc})") from exc
    return sha, config


@dataclass
class Catalogue:
    """What the driver serves: blobs by sha256 (a path on the driver), trees by manifest hash."""

    blobs: dict[str, str]
    trees: dict[str, tuple[Entry, ...]]

    @classmethod
    def empty(cls) -> Catalogue:
        return cls({}, {})

    def add_file(self, path: Path, sha256: str) -> str:
        self.blobs[sha256] = str(path)
        return sha256

    def add_tree(self, folder: Path) -> str:
        """Register every file of ``folder``; returns the tree's hash (as the board names it)."""
        files = tree_manifest(folder, "coordinator")
        entries = tuple((rel, f.sha256, f.size) for rel, f in files)
        for _, f in files:
            self.blobs[f.sha256] = str(f.path)
        sha = tree_sha256((rel, sha) for rel, sha, _ in entries)
        self.trees[sha] = entries
        return sha

    def merge(self, other: Catalogue) -> None:
        self.blobs.update(other.blobs)
        self.trees.update(other.trees)


# ---------------------------------------------------------------------------------------------
# Revisions of this repository
# ---------------------------------------------------------------------------------------------

WORKTREE = "worktree"  # a spec's name of the revision that is the working tree
DIRTY = "+dirty"  # after a commit: the working tree, with local changes to the sources


def git_output(*args: str, cwd: Path = REPO_ROOT) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise InputError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def worktree_revision(paths: Sequence[str]) -> str:
    """The commit of the working tree, with ``+dirty`` when ``paths`` have local changes."""
    try:
        commit = git_output("rev-parse", "HEAD")
    except InputError:
        return "unknown"
    status = subprocess.run(["git", "status", "--porcelain", "--", *paths], cwd=REPO_ROOT,
                            capture_output=True, text=True).stdout
    return commit + (DIRTY if status.strip() else "")


def commit_order(revisions: Iterable[str]) -> list[str]:
    """``revisions`` in commit order (ancestors first); those git does not know follow in the
    order given, then the working trees with local changes (``+dirty``)."""
    given = list(dict.fromkeys(revisions))
    commits = _commits([r for r in given if not r.endswith(DIRTY)])
    known = [r for r in given if r in commits]
    position = {}
    if known:
        walked = git_output("rev-list", "--topo-order", "--reverse", *known).split()
        position = {commit: i for i, commit in enumerate(walked)}
    ordered = sorted((r for r in known if r in position), key=position.__getitem__)
    rest = [r for r in given if r not in position and not r.endswith(DIRTY)]
    return ordered + rest + [r for r in given if r.endswith(DIRTY)]


def _commits(names: list[str]) -> set[str]:
    """Those of ``names`` that name a commit of the repository: one `git cat-file` for all
    (a history holds a thousand revisions)."""
    if not names:
        return set()
    query = "".join(f"{name}^{{commit}}\n" for name in names if "\n" not in name)
    done = subprocess.run(["git", "cat-file", "--batch-check"], cwd=REPO_ROOT, input=query,
                          capture_output=True, text=True)
    answers = done.stdout.splitlines() if done.returncode == 0 else []
    asked = [name for name in names if "\n" not in name]
    return {name for name, answer in zip(asked, answers, strict=False)
            if not answer.endswith(" missing") and " commit " in f"{answer} "}
