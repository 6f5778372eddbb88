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
import os
import re
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devices.cache import tree_manifest, tree_sha256
from devices.files import open_regular, read_json
from harness import REPO_ROOT
from harness.errors import InputError

Entry = tuple[str, str, int]  # a tree's file: (relative path, sha256, size)


def sha256_file(path: Path) -> str:
    """The file's sha256 (a regular file only: OSError for a FIFO or a device)."""
    digest = hashlib.sha256()
    with open_regular(path) as fh:
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


# A C source as tokens that matter: string and character literals kept whole, comments dropped
C_PIECES = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/|\s+',
                      re.S)


def code_hash(paths: list[Path]) -> str:
    """sha256 over the names and *code* of C sources ``paths``: their text without comments,
    each run of whitespace and comments as one space (literals kept as they are). Revisions
    that differ only in comments or layout have the same code hash: the same engine, though
    their binaries differ (the binary names its source hash)."""
    digest = hashlib.sha256()
    for path in sorted(paths, key=lambda p: p.name):
        text = path.read_text(encoding="utf-8", errors="replace")
        code, at = [], 0
        for found in C_PIECES.finditer(text):
            if found.start() > at:
                code.append(text[at:found.start()])
            piece = found.group(0)
            if piece[0] in "\"'":
                code.append(piece)
            elif code and code[-1] != " ":
                code.append(" ")
            at = found.end()
        code.append(text[at:])
        digest.update(path.name.encode() + b"\0" + "".join(code).strip().encode() + b"\0")
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
        shards = sorted(set(read_json(index)["weight_map"].values()))  # type: ignore[index]
    except OSError as exc:
        raise InputError(f"{index}: cannot read it ({exc.strerror or exc})") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{index}: no readable 'weight_map' ({exc!r})") from None
    digest = hashlib.sha256()
    for name in [index.name, *shards]:
        if not isinstance(name, str) or "/" in name or not (model_dir / name).is_file():
            raise InputError(f"{index}: shard {name!r} is not a file in {model_dir}")
        try:
            digest.update(f"{name} {sha256_file(model_dir / name)}\n".encode())
        except OSError as exc:
            raise InputError(f"{model_dir / name}: cannot read it ({exc.strerror or exc})"
                             ) from None
    return digest.hexdigest()


def model_config(model_dir: Path) -> dict[str, Any]:
    """The model's config.json, read through the capped, regular-file-only reader and nested
    at most ``devices.files.MAX_JSON_DEPTH`` deep; InputError naming the file otherwise."""
    path = model_dir / "config.json"
    try:
        config = read_json(path)
    except OSError as exc:
        raise InputError(f"model {model_dir}: cannot read config.json "
                         f"({exc.strerror or exc})") from None
    except ValueError as exc:
        raise InputError(f"model {model_dir}: config.json is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise InputError(f"model {model_dir}: config.json must be a JSON object")
    return config


# A model folder as the boards cache it: every file is pushed, so each must be a regular file;
# deeper folders or more files than this are no model (a symlink loop would be endless).
MAX_MODEL_DEPTH = 8
MAX_MODEL_FILES = 10_000


def check_model_folder(model_dir: Path) -> None:
    """Everything the coordinator reads of a model folder, read now (at submit, before a run):
    config.json (``model_config``), the weights (one file or a sharded checkpoint's index and
    shards: regular files), and the folder itself (regular files only, at most
    ``MAX_MODEL_DEPTH`` deep and ``MAX_MODEL_FILES`` files). InputError naming the problem."""
    if not model_dir.is_dir():
        raise InputError(f"model {model_dir}: not a folder")
    count = 0
    for root, dirs, names in os.walk(model_dir, followlinks=True):
        depth = len(Path(root).relative_to(model_dir).parts)
        if depth > MAX_MODEL_DEPTH:
            raise InputError(f"model {model_dir}: folders nested more than {MAX_MODEL_DEPTH} "
                             f"deep ({root}; a symlink loop?)")
        count += len(names)
        if count > MAX_MODEL_FILES:
            raise InputError(f"model {model_dir}: more than {MAX_MODEL_FILES} files")
        for name in names:
            path = Path(root, name)
            try:
                open_regular(path).close()
            except OSError as exc:
                raise InputError(f"model {model_dir}: {path} cannot be read "
                                 f"({exc.strerror or exc})") from None
        dirs.sort()
    model_config(model_dir)
    single, index = model_dir / "model.safetensors", model_dir / "model.safetensors.index.json"
    if not single.is_file() and index.is_file():
        try:
            read_json(index)
        except (OSError, ValueError) as exc:
            raise InputError(f"{index}: cannot read it as JSON ({exc})") from None


def model_identity(model_dir: Path) -> tuple[str, dict[str, Any]]:
    """The weights' sha256 and the model's config.json (``model_config``)."""
    sha = weights_sha256(model_dir)
    return sha, model_config(model_dir)


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


SHORT_SHA = 7  # the short commit id shown beside a commit's subject


SUBJECTS_KEPT = 65536  # commit subjects kept by a long-lived process (the dashboard)
_subjects_found: dict[str, str | None] = {}  # commit name -> its subject; None: not a commit


def _subjects(commits: Iterable[str]) -> dict[str, str | None]:
    """The subject of each commit name (None for a name git does not know as a commit), those
    not yet known read by one `git cat-file --batch` (a history labels a thousand)."""
    names = [c for c in dict.fromkeys(commits) if "\n" not in c and not c.startswith("-")]
    wanted = [name for name in names if name not in _subjects_found]
    if wanted:
        if len(_subjects_found) + len(wanted) > SUBJECTS_KEPT:
            _subjects_found.clear()
        query = "".join(f"{name}^{{commit}}\n" for name in wanted).encode()
        done = subprocess.run(["git", "cat-file", "--batch"], cwd=REPO_ROOT, input=query,
                              capture_output=True)
        found = _batch_subjects(done.stdout) if done.returncode == 0 else []
        _subjects_found.update(zip(wanted, (found + [None] * len(wanted))[:len(wanted)],
                                   strict=True))
    return {name: _subjects_found.get(name) for name in names}


def _batch_subjects(output: bytes) -> list[str | None]:
    """The subjects in `git cat-file --batch`'s answers, in order: an object's header line
    (``<sha> commit <size>``) and its content, or ``<name> missing`` (or ``ambiguous``). A
    subject is the message's first paragraph on one line, as `git log --format=%s` prints it."""
    subjects: list[str | None] = []
    at = 0
    while at < len(output):
        end = output.index(b"\n", at)
        header = output[at:end].split()
        at = end + 1
        if len(header) != 3 or not header[2].isdigit():
            subjects.append(None)
            continue
        size = int(header[2])
        content, at = output[at:at + size], at + size + 1
        message = content.partition(b"\n\n")[2].decode(errors="replace")
        subject = " ".join(message.strip().split("\n\n", 1)[0].split("\n")).strip()
        subjects.append(subject or None)
    return subjects


def revision_labels(revisions: Iterable[str | None]) -> dict[str, str]:
    """``revision_label`` of each revision, the subjects read at once."""
    named = [r for r in dict.fromkeys(revisions) if r]
    _subjects(r[:-len(DIRTY)] if r.endswith(DIRTY) else r for r in named)
    return {r: revision_label(r) for r in named}


def revision_label(revision: str | None) -> str:
    """A revision as people read it: the short sha and the commit's subject (``a1b2c3d fix
    the k=32 kernel``), ``+dirty`` kept; a name git does not know as it is."""
    if not revision:
        return ""
    commit, dirty = (revision[:-len(DIRTY)], DIRTY) if revision.endswith(DIRTY) else (revision,
                                                                                       "")
    subject = _subjects([commit]).get(commit)
    if subject is None:
        return revision
    return f"{commit[:SHORT_SHA]}{dirty} {subject}"
