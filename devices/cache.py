"""The content-addressed artifact cache on a device, shared by every transport.

Layout under the device's workdir::

    cache/<sha256>            one file per distinct content, read-only, verified before use
    cache/.incoming-*         uploads in flight (renamed into place only after verification)
    trees/<sha256>/<relpath>  a pushed directory: symlinks into cache/, named by the hash of its
                              manifest ("<sha256>  <relpath>" lines, sorted)

Every push asks the device about what it already has (one remote command for all files): a blob
is hashed there, unless this ``ArtifactCache`` already verified it and its inode, size, mtime
and ctime are unchanged since (any write changes the ctime). Only missing or corrupt files are
uploaded. The shell scripts below are constants: paths reach them as positional parameters,
never as shell text.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from devices.errors import TransferFailed
from devices.transport import Transport

HOST_TIMEOUT_S = 600.0  # hashing a multi-GB model on a board's eMMC takes a while

# $1 = cache dir; then pairs (name, stat signature at this transport's last verification of it,
# or "-"); names are sha256 digests. Optionally "--tree", a tree dir and pairs (relpath, sha256).
# A name that is a symlink or not a regular file (a directory in the way) prints "bad <name>": it
# is never valid, and the upload's finalize replaces it. For each file present prints
# "same <name> <sig>" when its inode, size, mtime and ctime are
# unchanged since then (any write changes the ctime); for the others "sig <name> <sig>" and
# then sha256sum's "<sha256>  <name>": the stat comes first, so a write during the hash changes
# the signature and the file is hashed again next time. With --tree, ends with "tree yes" when
# the tree exists and each of its entries is a symlink to its blob, else "tree no". Only
# built-ins run per file: one stat for the files verified before, one stat and one sha256sum
# for the rest, whatever their number.
STATE_SCRIPT = """
{ cd -- "$1" 2>/dev/null || { mkdir -p -- "$1" && cd -- "$1"; }; } || exit 1
shift
known=' ' check= stale=
while [ "$#" -ge 2 ] && [ "$1" != --tree ]; do
  case $1 in *[!0-9a-f]*) echo "not a sha256 digest: $1" >&2; exit 2 ;; esac
  if [ -L "$1" ] || { [ -e "$1" ] && [ ! -f "$1" ]; }; then
    echo "bad $1"
  elif [ -e "$1" ]; then
    if [ "$2" = - ]; then stale="$stale $1"; else check="$check $1" known="$known$1=$2 "; fi
  fi
  shift 2
done
if [ -n "$check" ]; then
  sigs=$(stat -L -c '%n %i:%s:%.9Y:%.9Z' -- $check 2>/dev/null)
  while read -r name sig; do
    case $known in
      *" $name=$sig "*) echo "same $name $sig" ;;
      *) stale="$stale $name" ;;
    esac
  done <<EOF
$sigs
EOF
fi
if [ -n "${stale# }" ]; then
  stat -L -c 'sig %n %i:%s:%.9Y:%.9Z' -- $stale 2>/dev/null
  sha256sum -- $stale 2>/dev/null
fi
if [ "$1" = --tree ]; then
  tree=$2; shift 2; ok=yes
  [ -d "$tree" ] || ok=no
  while [ "$ok" = yes ] && [ "$#" -ge 2 ]; do
    [ -L "$tree/$1" ] && [ "$tree/$1" -ef "$2" ] || ok=no
    shift 2
  done
  echo "tree $ok"
fi
exit 0
"""
SIGNATURE_RE = re.compile(r"\d+:\d+:\d+\.\d{9}:\d+\.\d{9}\Z")

# $1 = cache dir; then pairs (incoming name, expected sha256). Verifies each upload on the device,
# only then moves it into place, and prints "<sha256> <stat signature>" for it. Only a regular
# file inside the cache is replaced: a symlink at the name is removed (never followed: mv onto a
# symlink to a directory would move the upload into it, outside the workdir) and so is a
# directory in the way; the entry must be a regular file afterwards.
FINALIZE_SCRIPT = """
cd -- "$1" || exit 1
shift
while [ "$#" -ge 2 ]; do
  got=$(sha256sum -- "$1" | cut -d ' ' -f 1)
  if [ "$got" != "$2" ]; then
    rm -f -- "$1"
    echo "upload of $2 arrived with hash $got" >&2
    exit 3
  fi
  if [ -L "$2" ] || { [ -e "$2" ] && [ ! -f "$2" ]; }; then
    rm -rf -- "$2" || { echo "cannot remove $2 from the cache: not a regular file" >&2; exit 1; }
  fi
  chmod 0555 -- "$1" && mv -f -- "$1" "$2" || exit 1
  if [ -L "$2" ] || [ ! -f "$2" ]; then
    echo "cache entry $2 is not a regular file after the upload" >&2
    exit 1
  fi
  echo "$2 $(stat -c '%i:%s:%.9Y:%.9Z' -- "$2" 2>/dev/null || echo unknown)"
  shift 2
done
"""

# $1 = tree dir, $2 = cache dir; then pairs (relpath, sha256). Builds the tree beside its final
# name and renames it into place, so a half-built tree is never visible.
TREE_BUILD_SCRIPT = """
tree=$1; cache=$2; shift 2
tmp="$tree.incoming-$$"
rm -rf -- "$tmp" && mkdir -p -- "$tmp" || exit 1
while [ "$#" -ge 2 ]; do
  case $1 in */*) mkdir -p -- "$tmp/${1%/*}" || exit 1 ;; esac
  ln -s -- "$cache/$2" "$tmp/$1" || exit 1
  shift 2
done
rm -rf -- "$tree" && mv -- "$tmp" "$tree"
"""


# A shell function for the command of a run: `intact CACHE BLOBS SIGNATURES N [LINK SHA256]...`
# succeeds when each blob named in BLOBS (space-separated names in CACHE) still has its stat
# signature (SIGNATURES: one per line, same order) and each of the N tree entries LINK is a
# symlink to its blob. One stat for all blobs; the links are checked with built-ins. The caller
# shifts away its 4 + 2N arguments.
INTACT_FUNCTION = r"""
intact() {
  cache=$1 blobs=$2 signatures=$3 links=$4 status=0
  shift 4
  while [ "$links" -gt 0 ]; do
    [ -L "$1" ] && [ "$1" -ef "$cache/$2" ] || status=1
    links=$((links - 1))
    shift 2
  done
  [ -z "$blobs" ] || [ "$(cd -- "$cache" && stat -L -c '%i:%s:%.9Y:%.9Z' -- $blobs 2>/dev/null)" \
    = "$signatures" ] || status=1
  return $status
}
"""


@dataclass
class PushResult:
    """What one push did: ``status`` is "cached", "sent" or "repaired" (a corrupt copy replaced)."""

    local: str
    remote: str
    sha256: str
    size: int
    bytes_sent: int
    status: str


@dataclass(frozen=True)
class PushedArtifact:
    """What a push put on the device, so a later run can check it is still intact."""

    local: Path  # the file or directory that was pushed
    is_tree: bool
    blobs: tuple[str, ...]  # sha256 of each cached file it consists of
    links: tuple[tuple[str, str], ...] = ()  # a tree's entries: (path on the device, sha256)


@dataclass(frozen=True)
class _LocalFile:
    path: Path
    sha256: str
    size: int


_hash_memo: dict[tuple[str, int, int, int], str] = {}


def local_sha256(path: Path) -> str:
    """SHA-256 of a local file, memoised on (path, inode, size, mtime)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _hash_memo:
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        _hash_memo[key] = digest.hexdigest()
    return _hash_memo[key]


def _local_file(path: Path) -> _LocalFile:
    return _LocalFile(path, local_sha256(path), path.stat().st_size)


def _sh(transport: Transport, script: str, args: list[str]) -> tuple[int, str, str]:
    result = transport.run_host(["sh", "-c", script, "sh", *args], timeout=HOST_TIMEOUT_S)
    return result.exit_code, result.stdout, result.stderr


@dataclass
class _CacheState:
    valid: set[str]  # blobs whose cached copy has exactly their hash
    present: set[str]  # blobs present under their name, valid or not
    tree_ok: bool  # the tree asked about exists and each entry links to its blob


def tree_manifest(local_dir: Path, device: str) -> list[tuple[str, _LocalFile]]:
    """(relative path, file) for every file under ``local_dir``, sorted; symlinks followed."""
    entries = []
    for root, dirs, names in os.walk(local_dir, followlinks=True):
        dirs.sort()
        for name in sorted(names):
            path = Path(root, name)
            rel = path.relative_to(local_dir).as_posix()
            if not path.is_file():
                raise TransferFailed(device, f"cannot push {path}: not a regular file")
            entries.append((rel, _local_file(path)))
    return sorted(entries, key=lambda e: e[0])


def tree_sha256(entries: Iterable[tuple[str, str]]) -> str:
    """The name of a tree: the sha256 of its manifest ("<sha256>  <relpath>" lines, sorted)."""
    manifest = "".join(f"{sha}  {rel}\n" for rel, sha in sorted(entries))
    return hashlib.sha256(manifest.encode()).hexdigest()


class ArtifactCache:
    """The device's cache as one connection sees it: pushes through ``transport`` (its four
    primitives only), and what this connection verified and pushed.

    The state lives as long as the connection's user keeps this object: a blob verified through
    it is not hashed again while its stat signature is unchanged, and a path a push returned can
    be checked (``intact_args``) and pushed again (``push_again``) before a run uses it.
    """

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.bytes_sent = 0  # uploaded through this object
        self.last_push: PushResult | None = None
        # sha256 -> stat signature of cached blobs verified through this object
        self.verified_blobs: dict[str, str] = {}
        self.pushed: dict[str, PushedArtifact] = {}  # by the path a push returned
        self.dir = transport.path("cache")

    @property
    def device(self) -> str:
        return self.transport.device.name

    def push(self, local_path: Path | str) -> str:
        """Put a file in the device's content-addressed cache; returns its path there."""
        local_path = Path(local_path)
        if not local_path.is_file():
            raise TransferFailed(self.device, f"cannot push {local_path}: not a file")
        before = self.bytes_sent
        f = _local_file(local_path)
        status = self._ensure_blobs([f])[0][f.sha256]
        remote = self.transport.path("cache", f.sha256)
        self.last_push = PushResult(str(local_path), remote, f.sha256, f.size,
                                    self.bytes_sent - before, status)
        self.pushed[remote] = PushedArtifact(local_path, False, (f.sha256,))
        return remote

    def push_tree(self, local_dir: Path | str) -> str:
        """Put a directory (e.g. a model) on the device, content-addressed; returns its path."""
        local_dir = Path(local_dir)
        if not local_dir.is_dir():
            raise TransferFailed(self.device, f"cannot push {local_dir}: not a directory")
        before = self.bytes_sent
        entries = tree_manifest(local_dir, self.device)
        tree_sha = tree_sha256((rel, f.sha256) for rel, f in entries)
        tree = self.transport.path("trees", tree_sha)
        pairs = [x for rel, f in entries for x in (rel, f.sha256)]
        status, tree_ok = self._ensure_blobs([f for _, f in entries], [tree, *pairs])
        if not tree_ok:
            code, _, err = _sh(self.transport, TREE_BUILD_SCRIPT, [tree, self.dir, *pairs])
            if code != 0:
                raise TransferFailed(self.device,
                                     f"cannot build tree {shlex.quote(tree)}: {err.strip()}")
        overall = "cached"
        for s in ("sent", "repaired"):
            if s in status.values():
                overall = s
        self.last_push = PushResult(str(local_dir), tree, tree_sha,
                                    sum(f.size for _, f in entries),
                                    self.bytes_sent - before, overall)
        self.pushed[tree] = PushedArtifact(
            local_dir, True, tuple(f.sha256 for _, f in entries),
            tuple((f"{tree}/{rel}", f.sha256) for rel, f in entries))
        return tree

    def intact_args(self, argv: list[str]) -> list[str]:
        """The arguments of INTACT_FUNCTION for what ``argv`` uses of this object's pushes: the
        signature of each blob at its verification (a blob whose stat gave no well-formed
        signature is not checked), and each tree entry."""
        named = [item for _, item in self._named(argv)]
        memo = self.verified_blobs
        blobs = sorted({sha for item in named for sha in item.blobs if sha in memo})
        links = [x for item in named for link in item.links for x in link]
        return [self.dir, " ".join(blobs), "\n".join(memo[sha] for sha in blobs),
                str(len(links) // 2), *links]

    def push_again(self, argv: list[str]) -> None:
        """Push every artifact ``argv`` uses again: verified on the device, repaired if need
        be."""
        for arg, item in self._named(argv):
            again = self.push_tree(item.local) if item.is_tree else self.push(item.local)
            if again != arg:
                raise TransferFailed(self.device,
                                     f"{item.local} changed here since it was pushed as {arg}; "
                                     "push it again and run with the new path")

    def _named(self, argv: list[str]) -> list[tuple[str, PushedArtifact]]:
        """The artifacts pushed through this object whose paths are elements of ``argv``."""
        return [(arg, self.pushed[arg]) for arg in dict.fromkeys(map(str, argv))
                if arg in self.pushed]

    def _state(self, shas: list[str], tree: list[str] | None = None) -> _CacheState:
        """What the device's cache holds of ``shas`` (and whether ``tree`` = [tree dir,
        relpath, sha256, ...] is intact), in one remote command.

        A blob is hashed on the device unless it was verified through this object before and
        its stat signature has not changed since; the signature is remembered only when it is
        well formed.
        """
        memo = self.verified_blobs
        args = [x for sha in sorted(set(shas)) for x in (sha, memo.get(sha, "-"))]
        if tree is not None:
            args += ["--tree", *tree]
        code, out, err = _sh(self.transport, STATE_SCRIPT, [self.dir, *args])
        if code != 0:
            raise TransferFailed(self.device, f"cannot use the cache directory {self.dir}: "
                                              f"{err.strip()}")
        state = _CacheState(set(), set(), False)
        signatures, hashes = {}, {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "same":
                state.valid.add(parts[1])
                state.present.add(parts[1])
            elif len(parts) == 3 and parts[0] == "sig":
                signatures[parts[1]] = parts[2]
            elif len(parts) == 2 and parts[0] == "tree":
                state.tree_ok = parts[1] == "yes"
            elif len(parts) == 2 and parts[0] == "bad":
                state.present.add(parts[1])  # in the way: replaced by the upload
                memo.pop(parts[1], None)
            elif len(parts) == 2:
                hashes[parts[1]] = parts[0]
        for name, sig in signatures.items():  # hashed now: verified or not
            state.present.add(name)
            memo.pop(name, None)
            if hashes.get(name) == name:
                state.valid.add(name)
                if SIGNATURE_RE.match(sig):
                    memo[name] = sig
        for name in set(shas) - state.present:
            memo.pop(name, None)
        return state

    def _ensure_blobs(self, files: list[_LocalFile],
                      tree: list[str] | None = None) -> tuple[dict[str, str], bool]:
        """Make every file present and verified in the cache; returns (sha256 -> status,
        whether ``tree`` was intact: see ``_state``)."""
        by_sha = {f.sha256: f for f in files}
        state = self._state(list(by_sha), tree)
        status = {sha: "cached" for sha in state.valid}
        missing = [f for sha, f in by_sha.items() if sha not in state.valid]
        if not missing:
            return status, state.tree_ok
        pairs: list[str] = []
        for f in missing:
            incoming = f".incoming-{f.sha256[:16]}-{secrets.token_hex(4)}"
            self.bytes_sent += self.transport.upload(f.path, self.transport.path("cache",
                                                                                  incoming))
            pairs += [incoming, f.sha256]
            status[f.sha256] = "repaired" if f.sha256 in state.present else "sent"
        code, out, err = _sh(self.transport, FINALIZE_SCRIPT, [self.dir, *pairs])
        if code != 0:
            raise TransferFailed(self.device,
                                 f"artifact verification failed after upload: {err.strip()}")
        for line in out.splitlines():
            sha, _, sig = line.partition(" ")
            if sha in status and SIGNATURE_RE.match(sig):
                self.verified_blobs[sha] = sig
        return status, state.tree_ok
