"""The tolerant known_hosts reader and the append-only writer, against files OpenSSH's own tools
wrote (ssh-keygen keys, `ssh-keygen -H` hashed names) and lines paramiko cannot parse."""

from __future__ import annotations

import base64
import struct
import subprocess
from pathlib import Path

import paramiko
import pytest

from devices import known_hosts


def public_key(tmp_path: Path, name: str, kind: str = "ed25519") -> tuple[str, bytes]:
    """A fresh host key made by ssh-keygen: (type, public blob)."""
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True)
    key_type, encoded = (path.with_suffix(".pub")).read_text().split()[:2]
    return key_type, base64.b64decode(encoded)


def line(name: str, key: tuple[str, bytes], marker: str = "") -> str:
    return f"{marker} {name} {key[0]} {base64.b64encode(key[1]).decode()}".strip()


def sk_ed25519_line(name: str) -> str:
    """A FIDO (security key) host entry: a type paramiko has no class for."""
    def string(data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + data
    blob = string(b"sk-ssh-ed25519@openssh.com") + string(bytes(range(32))) + string(b"ssh:")
    return f"{name} sk-ssh-ed25519@openssh.com {base64.b64encode(blob).decode()} fido key"


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, tuple[str, bytes]]:
    return {name: public_key(tmp_path, name) for name in ("board", "other", "ca")}


def test_lines_paramiko_rejects_are_skipped_not_fatal(tmp_path: Path, keys) -> None:
    path = tmp_path / "known_hosts"
    board = "[10.0.0.5]:2222"
    path.write_text("\n".join([
        "# my hosts",
        line("*.lab.example", keys["ca"], "@cert-authority"),
        sk_ed25519_line("gateway.example"),
        "broken.example ssh-ed25519 AAAA-not-base64!!",
        "truncated.example ssh-ed25519 AAAAC3NzaC1lZDI1NTE5",
        "@bogus-marker host ssh-ed25519 " + base64.b64encode(keys["other"][1]).decode(),
        "onlytwo ssh-ed25519",
        line("other.example", keys["other"]),
        line(board, keys["board"]) + " a comment",
    ]))  # no newline at the end, as some editors leave it
    with pytest.raises(Exception):  # noqa: B017 - what paramiko does with this very file
        paramiko.HostKeys(str(path))

    assert known_hosts.check(path, board, *keys["board"]).status == "known"
    assert known_hosts.check(path, "other.example", *keys["other"]).status == "known"
    assert known_hosts.check(path, board, *keys["other"]).status == "changed"
    assert known_hosts.check(path, "new.example", *keys["board"]).status == "unknown"
    # a certificate authority never vouches for a plain key of the hosts it covers
    assert known_hosts.check(path, "x.lab.example", *keys["ca"]).status == "unknown"
    usable = {e.line for e in known_hosts.read_entries(path)}
    assert usable == {2, 3, 8, 9}


def test_patterns_negations_and_hashed_names(tmp_path: Path, keys) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(line("*.lab,!secret.lab,[10.0.0.?]:2222", keys["board"]) + "\n")
    for name in ("a.lab", "A.LAB", "[10.0.0.7]:2222"):
        assert known_hosts.check(path, name, *keys["board"]).status == "known", name
    for name in ("secret.lab", "lab", "[10.0.0.17]:2222", "10.0.0.7"):
        assert known_hosts.check(path, name, *keys["board"]).status == "unknown", name

    # `ssh-keygen -H` replaces names by salted HMACs; the reader must match them
    hashed = tmp_path / "hashed"
    hashed.write_text(line("[127.0.1.10]:2022", keys["board"]) + "\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(hashed)], check=True, capture_output=True)
    assert hashed.read_text().startswith("|1|")
    assert known_hosts.check(hashed, "[127.0.1.10]:2022", *keys["board"]).status == "known"
    assert known_hosts.check(hashed, "[127.0.1.10]:2023", *keys["board"]).status == "unknown"


def test_revoked_wins_over_a_plain_entry(tmp_path: Path, keys) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(line("board", keys["board"]) + "\n" + line("board", keys["board"], "@revoked")
                    + "\n" + line("elsewhere", keys["other"], "@revoked") + "\n"
                    + line("board", keys["other"]) + "\n")
    verdict = known_hosts.check(path, "board", *keys["board"])
    assert verdict.status == "revoked" and verdict.entry.line == 2
    # a revocation for another host does not touch this one
    assert known_hosts.check(path, "board", *keys["other"]).status == "known"


def test_append_keeps_every_byte(tmp_path: Path, keys) -> None:
    path = tmp_path / "ssh" / "known_hosts"
    known_hosts.append(path, [line("a", keys["board"])])  # creates the folder and the file
    original = path.read_bytes() + b"# caf\xc3\xa9 \xff odd bytes\n" + sk_ed25519_line("g").encode()
    path.write_bytes(original)
    known_hosts.append(path, [line("b", keys["other"])])
    data = path.read_bytes()
    assert data.startswith(original)
    assert data[len(original):] == b"\n" + line("b", keys["other"]).encode() + b"\n"
    assert known_hosts.check(path, "b", *keys["other"]).status == "known"
    assert known_hosts.check(path, "a", *keys["board"]).status == "known"
