"""Removing old artifacts from a content-addressed cache (a board's, or a node's).

Both caches have the same shape: a folder of blobs named by sha256 and a folder of trees (a
model directory as symlinks into the blobs). A tree older than the given age goes; a blob goes
when it is older and no remaining tree links to it. Uploads left half-way (``.incoming-*``)
age out like blobs. The script is a constant; the folders reach it as positional parameters.

Nothing in use goes, whichever store the run that uses it belongs to: a board's cache is
cleaned under the board's own lock file (devices.boardlock), so it is left alone while any
coordinator's command holds the board, and no run starts on it while it is cleaned; a node
cache is cleaned under an exclusive ``flock`` on its ``.benchfarm-lock``, which every board
runner using the cache holds shared while it lives (``node_cache_lock``), so it is left alone
while any run on this machine may read it.
"""

from __future__ import annotations

import fcntl
import math
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from devices.boardlock import LockHolder, check_locked, locked
from devices.errors import BoardLocked, DeviceError
from devices.transport import Transport

NODE_LOCK = ".benchfarm-lock"

GC_TIMEOUT_S = 600.0

# $1 blobs dir, $2 trees dir, $3 age in minutes (find -mmin +N), $4 "1" for a dry run.
# Prints "tree PATH" and "blob BYTES PATH" for each thing removed (or that would be).
GC_SCRIPT = """
blobs=$1 trees=$2 mins=$3 dry=$4
refs=" "
if [ -d "$trees" ]; then
  for t in $(find "$trees" -mindepth 1 -maxdepth 1 ! -mmin "+$mins"); do
    for target in $(find "$t" -type l -exec readlink {} \\;); do refs="$refs${target##*/} "; done
  done
  for t in $(find "$trees" -mindepth 1 -maxdepth 1 -mmin "+$mins"); do
    echo "tree $t"
    [ "$dry" = 1 ] || rm -rf -- "$t"
  done
fi
if [ -d "$blobs" ]; then
  for b in $(find "$blobs" -maxdepth 1 -type f -mmin "+$mins"); do
    case $refs in *" ${b##*/} "*) continue ;; esac
    echo "blob $(stat -c %s -- "$b") $b"
    [ "$dry" = 1 ] || rm -f -- "$b"
  done
fi
"""


@dataclass
class Collected:
    where: str  # the board, or "node cache PATH"
    trees: list[str] = field(default_factory=list)
    blobs: dict[str, int] = field(default_factory=dict)  # path -> bytes
    in_use: str | None = None  # why nothing was looked at (a run uses it)

    @property
    def bytes(self) -> int:
        return sum(self.blobs.values())


def _parse(where: str, output: str) -> Collected:
    found = Collected(where)
    for line in output.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "tree":
            found.trees.append(rest)
        elif kind == "blob":
            size, _, path = rest.partition(" ")
            found.blobs[path] = int(size)
    return found


def _args(older_than_s: float, dry_run: bool) -> list[str]:
    return [str(max(math.ceil(older_than_s / 60), 0)), "1" if dry_run else "0"]


def collect_board(transport: Transport, older_than_s: float, dry_run: bool,
                  holder: LockHolder) -> Collected:
    """Collect the board's cache (``cache/`` and ``trees/`` under its workdir) under the
    board's lock file as ``holder``; left alone (``in_use``) while another command holds it."""
    name = transport.device.name
    done = transport.run_host(locked(["sh", "-c", GC_SCRIPT, "sh", transport.path("cache"),
                                      transport.path("trees"), *_args(older_than_s, dry_run)],
                                     holder), GC_TIMEOUT_S)
    try:
        check_locked(name, transport.device.workdir, done)
    except BoardLocked as exc:
        return Collected(name, in_use=str(exc).removeprefix(f"device {name!r}: "))
    if not done.ok:
        raise DeviceError(transport.device.name,
                          f"cleaning its cache failed: {done.stderr.strip()}")
    return _parse(transport.device.name, done.stdout)


def node_cache_lock(root: Path, exclusive: bool = False) -> BinaryIO | None:
    """The node cache's lock file, opened and locked: shared (a board runner using the cache;
    waits while it is cleaned) or ``exclusive`` without waiting (gc; None while a runner holds
    it). Closing the file releases it."""
    root.mkdir(parents=True, exist_ok=True)
    handle = open(root / NODE_LOCK, "ab")  # noqa: SIM115 - held by the caller
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB if exclusive else fcntl.LOCK_SH)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def collect_folder(root: Path, older_than_s: float, dry_run: bool) -> Collected:
    """Collect a node cache on this machine (``blobs/`` and ``trees/`` under ``root``), holding
    its lock exclusively; left alone (``in_use``) while a board runner holds it."""
    where = f"node cache {root}"
    lock = node_cache_lock(root, exclusive=True)
    if lock is None:
        return Collected(where, in_use="a board runner on this machine uses it (its "
                                       f"{NODE_LOCK} is held)")
    with lock:
        done = subprocess.run(["sh", "-c", GC_SCRIPT, "sh", str(root / "blobs"),
                               str(root / "trees"), *_args(older_than_s, dry_run)],
                              capture_output=True, text=True, timeout=GC_TIMEOUT_S)
    if done.returncode != 0:
        raise DeviceError(where, f"cleaning failed: {done.stderr.strip()}")
    return _parse(where, done.stdout)
