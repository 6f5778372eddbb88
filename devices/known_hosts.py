"""known_hosts files, read as tolerantly as OpenSSH reads them and only ever appended to.

The default file is the user's own ``~/.ssh/known_hosts``, which OpenSSH and other tools share,
so benchfarm must neither break on what they write nor lose any of it. paramiko's ``HostKeys``
fails on lines it does not understand (an ``@cert-authority`` line, a key type it lacks such as
``sk-ssh-ed25519@openssh.com``, a corrupt line for some other host) and rewrites the whole file
on save, dropping comments and those lines. So this module reads the file itself, the way
OpenSSH's hostfile.c does: a line it cannot parse is skipped, not fatal; host patterns may be
comma lists with ``*``/``?`` wildcards and ``!`` negations, or hashed (``|1|salt|hmac``);
``@revoked`` keys are refused for the hosts they match; ``@cert-authority`` lines sign host
certificates, which benchfarm does not use, so they never vouch for a plain key. Keys are
compared as (type, public blob), so no key type needs to be known to paramiko. Writing is
``append`` only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from devices.files import read_bytes

MARKERS = ("@cert-authority", "@revoked")


@dataclass(frozen=True)
class Entry:
    """One usable line of a known_hosts file."""

    line: int  # 1-based, for messages
    marker: str | None  # None, "@cert-authority" or "@revoked"
    patterns: str  # the host field as written (a pattern list or one hashed name)
    key_type: str
    blob: bytes  # the decoded public key

    def matches(self, name: str) -> bool:
        return host_matches(self.patterns, name)

    def same_key(self, key_type: str, blob: bytes) -> bool:
        return self.key_type == key_type and self.blob == blob


def _blob_type(blob: bytes) -> str | None:
    """The key type a public-key blob names, if the blob is well formed: a sequence of at least
    two length-prefixed fields (type, then key material) that ends exactly at its end."""
    fields, offset = [], 0
    while offset < len(blob):
        if offset + 4 > len(blob):
            return None
        (length,) = struct.unpack(">I", blob[offset:offset + 4])
        if offset + 4 + length > len(blob):
            return None
        fields.append(blob[offset + 4:offset + 4 + length])
        offset += 4 + length
    return fields[0].decode("ascii", "replace") if len(fields) >= 2 else None


def parse_line(text: str, number: int) -> Entry | None:
    """The entry on one line, or None for a blank, comment or malformed line (skipped)."""
    fields = text.split()
    if not fields or fields[0].startswith("#"):
        return None
    marker = None
    if fields[0].startswith("@"):
        if fields[0] not in MARKERS:
            return None
        marker, fields = fields[0], fields[1:]
    if len(fields) < 3:
        return None
    patterns, key_type, encoded = fields[:3]
    try:
        blob = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
    if _blob_type(blob) != key_type:  # e.g. a truncated or pasted-over key
        return None
    return Entry(number, marker, patterns, key_type, blob)


def _glob(pattern: str, name: str) -> bool:
    """OpenSSH's wildcard match: ``*`` any run, ``?`` one character, nothing else special."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, name, re.DOTALL) is not None


def _hashed_matches(field: str, name: str) -> bool:
    """``|1|base64(salt)|base64(HMAC-SHA1(salt, name))``, as `ssh-keygen -H` writes."""
    parts = field.split("|")
    if len(parts) != 4 or parts[1] != "1":
        return False
    try:
        salt, digest = base64.b64decode(parts[2]), base64.b64decode(parts[3])
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), digest)


def host_matches(patterns: str, name: str) -> bool:
    """Whether ``name`` (``host`` or ``[host]:port``) is one of the hosts a line names."""
    if patterns.startswith("|"):
        return _hashed_matches(patterns, name)
    name = name.lower()
    matched = False
    for pattern in patterns.lower().split(","):
        negated = pattern.startswith("!")
        if _glob(pattern[1:] if negated else pattern, name):
            if negated:
                return False  # a negated match excludes the host whatever else matches
            matched = True
    return matched


def read_entries(path: Path) -> list[Entry]:
    """Every usable line of ``path`` (none when it does not exist)."""
    try:
        data = read_bytes(path)
    except FileNotFoundError:
        return []
    text = data.decode("utf-8", "replace")  # a stray byte spoils its own line only
    return [entry for number, line in enumerate(text.split("\n"), 1)
            if (entry := parse_line(line, number)) is not None]


@dataclass(frozen=True)
class Verdict:
    """What a known_hosts file says about the key a host presented."""

    status: str  # "known", "revoked", "changed" (same type, other key) or "unknown"
    entry: Entry | None = None  # the deciding line (known / revoked), when there is one
    recorded: tuple[Entry, ...] = ()  # the host's plain entries (for "changed" messages)


def entries_for(path: Path, name: str) -> list[Entry]:
    """The usable lines of ``path`` that name host ``name``, in file order."""
    return [entry for entry in read_entries(path) if entry.matches(name)]


def recorded_types(path: Path, name: str) -> set[str]:
    """The key types recorded (as plain entries) for host ``name``."""
    return {entry.key_type for entry in entries_for(path, name) if entry.marker is None}


def check(path: Path, name: str, key_type: str, blob: bytes) -> Verdict:
    """OpenSSH's decision for ``name`` presenting (key_type, blob): a revoked key is refused
    whatever else the file says; any plain entry with the key accepts it; a plain entry of the
    same type with another key means the key changed; otherwise the host key is unknown."""
    entries = entries_for(path, name)
    plain = tuple(e for e in entries if e.marker is None)
    for entry in entries:
        if entry.marker == "@revoked" and entry.same_key(key_type, blob):
            return Verdict("revoked", entry, plain)
    for entry in plain:
        if entry.same_key(key_type, blob):
            return Verdict("known", entry, plain)
    if any(entry.key_type == key_type for entry in plain):
        return Verdict("changed", None, plain)
    return Verdict("unknown", None, plain)


def entry_line(name: str, key_type: str, blob: bytes, marker: str | None = None) -> str:
    text = f"{name} {key_type} {base64.b64encode(blob).decode()}"
    return f"{marker} {text}" if marker else text


def append(path: Path, lines: list[str]) -> None:
    """Add lines at the end of ``path``; what is there stays byte for byte."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with path.open("ab+") as handle:
        handle.seek(0, 2)
        prefix = b""
        if handle.tell() > 0:
            handle.seek(-1, 2)
            if handle.read(1) != b"\n":
                prefix = b"\n"  # the last line had no newline: keep it a line of its own
        handle.write(prefix + "".join(f"{line}\n" for line in lines).encode())
