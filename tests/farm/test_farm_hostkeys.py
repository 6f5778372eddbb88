"""Host-key verification and authentication against the real local farm."""

from __future__ import annotations

import base64
import dataclasses
import socket
import subprocess
import time
from pathlib import Path

import paramiko
import pytest

from devices.connect import connect
from devices.errors import (
    AuthFailed,
    DeviceUnreachable,
    HostKeyError,
    HostKeyMismatch,
    HostKeyRevoked,
    UnknownHostKey,
)
from devices.inventory import Device, load_inventory
from devices.ssh import key_fingerprint, trust_device
from harness.cli import main


def inventory_with_known_hosts(farm, tmp_path: Path, known_hosts: Path) -> Path:
    """A copy of the farm's inventory whose devices use another known_hosts file."""
    text = farm.inventory_path.read_text().replace(str(farm.state_dir / "known_hosts"),
                                                   str(known_hosts))
    path = tmp_path / "inventory.toml"
    path.write_text(text)
    return path


def host_fingerprint(farm, node: str) -> str:
    """The fingerprint of the host key the farm generated for ``node``, read from disk."""
    pub = (farm.state_dir / "nodes" / node / "ssh_host_ed25519_key.pub").read_text().split()
    return key_fingerprint(paramiko.PKey.from_type_string(pub[0], base64.b64decode(pub[1])))


def host_entry(farm, node: str, name: str, marker: str = "") -> str:
    """A known_hosts line giving ``node``'s host key to ``name``."""
    pub = (farm.state_dir / "nodes" / node / "ssh_host_ed25519_key.pub").read_text().split()
    return f"{marker} {name} {pub[0]} {pub[1]}".strip()


def openssh_accepts(device: Device, known_hosts: Path) -> bool:
    """Whether the real OpenSSH client, checking host keys strictly against ``known_hosts``,
    gets a command through: the reference for what a known_hosts file means."""
    result = subprocess.run(
        ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
         "-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
         "-o", "CheckHostIP=no", "-o", "ConnectTimeout=10", "-i", str(device.key),
         "-p", str(device.port), f"{device.user}@{device.host}", "true"],
        capture_output=True, text=True, timeout=60)
    return result.returncode == 0


def other_hosts_lines(tmp_path: Path) -> str:
    """What a user's ~/.ssh/known_hosts holds besides the farm: lines paramiko cannot load."""
    key = tmp_path / "stranger_host"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    kind, blob = key.with_suffix(".pub").read_text().split()[:2]
    hashed = tmp_path / "hashed"
    hashed.write_text(f"hidden.example {kind} {blob}\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(hashed)], check=True, capture_output=True)
    sk = "AAAAGnNrLXNzaC1lZDI1NTE5QG9wZW5zc2guY29tAAAAIAABAgMEBQYHCAkKCwwNDg8QERITFBUWFxgZGhsc"
    return "".join([
        "# keys of the lab\n",
        f"@cert-authority *.lab.example {kind} {blob} lab CA\n",
        hashed.read_text(),
        f"gateway.example sk-ssh-ed25519@openssh.com {sk}HR4fAAAABHNzaDo= fido\n",
        f"@revoked old.example {kind} {blob}\n",
        "broken.example ssh-ed25519 AAAA-this-is-not-base64\n",
        f"plain.example {kind} {blob}",  # no newline at the end
    ])


def test_trust_appends_to_a_shared_known_hosts(farm, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    original = other_hosts_lines(tmp_path)
    known_hosts.write_text(original)
    inventory = inventory_with_known_hosts(farm, tmp_path, known_hosts)
    device = load_inventory(inventory).get("farm-x86")
    with pytest.raises(UnknownHostKey):  # not a paramiko error about someone else's line
        connect(device)

    assert main(["devices", "trust", "--inventory", str(inventory), "farm-x86"]) == 0
    text = known_hosts.read_text()
    assert text.startswith(original)  # appended: every other line kept byte for byte
    assert text[len(original):] == "\n" + host_entry(farm, "farm-x86",
                                                     f"[{device.host}]:{device.port}") + "\n"
    with connect(device) as t:
        assert t.run(["echo", "trusted"], timeout=30).stdout == "trusted\n"
    assert openssh_accepts(device, known_hosts)
    assert main(["devices", "trust", "--inventory", str(inventory), "farm-x86"]) == 0
    assert known_hosts.read_text() == text  # already trusted: nothing written


def test_hashed_and_revoked_entries_are_honoured(farm, tmp_path: Path) -> None:
    device = farm.x86
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(host_entry(farm, "farm-x86", f"[{device.host}]:{device.port}") + "\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(known_hosts)], check=True, capture_output=True)
    assert str(device.host) not in known_hosts.read_text()
    device = dataclasses.replace(device, known_hosts=known_hosts)
    with connect(device) as t:
        assert t.run(["true"], timeout=30).ok

    with known_hosts.open("a") as handle:  # the board's key leaked: revoke it for every host
        handle.write(host_entry(farm, "farm-x86", "*", "@revoked") + "\n")
    assert not openssh_accepts(device, known_hosts)
    with pytest.raises(HostKeyRevoked, match=r"farm-x86.*line 2 .*@revoked"):
        connect(device)
    inventory = inventory_with_known_hosts(farm, tmp_path, known_hosts)
    assert main(["devices", "trust", "--inventory", str(inventory), "--replace", "farm-x86"]) == 1


def sshd_with_two_host_keys(farm, tmp_path: Path) -> tuple[subprocess.Popen, int, str]:
    """Another sshd like farm-x86's, offering an ECDSA host key besides its Ed25519 one:
    (process, port, the ECDSA key's known_hosts fields)."""
    ecdsa = tmp_path / "ssh_host_ecdsa_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", str(ecdsa)], check=True)
    with socket.socket() as s:
        s.bind((farm.x86.host, 0))
        port = s.getsockname()[1]
    lines = (farm.state_dir / "nodes" / "farm-x86" / "sshd_config").read_text().splitlines()
    lines = [f"ListenAddress {farm.x86.host}:{port}" if line.startswith("ListenAddress")
             else f"PidFile {tmp_path / 'sshd.pid'}" if line.startswith("PidFile") else line
             for line in lines] + [f"HostKey {ecdsa}"]
    (tmp_path / "sshd_config").write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(tmp_path / "sshd_config")],
                            stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            with socket.create_connection((farm.x86.host, port), timeout=1) as s:
                if s.recv(4).startswith(b"SSH-"):
                    break
        except OSError:
            time.sleep(0.1)
    return proc, port, " ".join(ecdsa.with_suffix(".pub").read_text().split()[:2])


def test_a_host_known_by_an_older_key_type_is_asked_for_that_key(farm, tmp_path: Path) -> None:
    proc, port, ecdsa = sshd_with_two_host_keys(farm, tmp_path)
    try:
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text(f"[{farm.x86.host}]:{port} {ecdsa}\n")  # as an older ssh wrote it
        device = dataclasses.replace(farm.x86, port=port, known_hosts=known_hosts)
        assert openssh_accepts(device, known_hosts)
        with connect(device) as t:  # paramiko alone would ask for Ed25519 first
            assert t.run(["true"], timeout=30).ok
        key, outcome = trust_device(device)
        assert (key.get_name(), outcome) == ("ecdsa-sha2-nistp256", "already trusted")
        assert known_hosts.read_text() == f"[{farm.x86.host}]:{port} {ecdsa}\n"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_unreadable_known_hosts_is_named_not_retried(farm, tmp_path: Path) -> None:
    device = dataclasses.replace(farm.x86, known_hosts=tmp_path, connect_retries=3)
    with pytest.raises(HostKeyError,
                       match=f"farm-x86.*cannot read {tmp_path}: not a regular file"):
        connect(device)


def test_unknown_host_key_is_refused_then_trusted(farm, tmp_path: Path, capsys) -> None:
    known_hosts = tmp_path / "known_hosts"
    inventory = inventory_with_known_hosts(farm, tmp_path, known_hosts)
    device = load_inventory(inventory).get("farm-x86")
    with pytest.raises(UnknownHostKey) as info:
        connect(device)
    assert "farm-x86" in str(info.value) and "benchfarm devices trust farm-x86" in str(info.value)
    assert not known_hosts.exists()

    assert main(["devices", "trust", "--inventory", str(inventory), "farm-x86"]) == 0
    out = capsys.readouterr().out
    expected = host_fingerprint(farm, "farm-x86")
    assert f"farm-x86: root@{device.host}:{device.port} ssh-ed25519 {expected} recorded" in out
    with connect(device) as t:
        assert t.run(["echo", "trusted"], timeout=30).stdout == "trusted\n"

    # farm-arm is still unknown: trusting one device trusts nothing else.
    with pytest.raises(UnknownHostKey, match="farm-arm"):
        connect(load_inventory(inventory).get("farm-arm"))


def test_changed_host_key_is_refused_until_replaced(farm, tmp_path: Path) -> None:
    # Record farm-arm's key under farm-x86's address: to the client the x86 key has "changed".
    x86 = farm.x86
    arm_pub = (farm.state_dir / "nodes" / "farm-arm" / "ssh_host_ed25519_key.pub").read_text()
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[{x86.host}]:{x86.port} {' '.join(arm_pub.split()[:2])}\n")
    inventory = inventory_with_known_hosts(farm, tmp_path, known_hosts)
    device = load_inventory(inventory).get("farm-x86")

    with pytest.raises(HostKeyMismatch) as info:
        connect(device)
    assert "farm-x86" in str(info.value) and host_fingerprint(farm, "farm-x86") in str(info.value)
    # trust refuses to overwrite silently, or to record a key that is not the expected one ...
    assert main(["devices", "trust", "--inventory", str(inventory), "farm-x86"]) == 1
    assert main(["devices", "trust", "--inventory", str(inventory), "--replace",
                 "--expect", host_fingerprint(farm, "farm-arm"), "farm-x86"]) == 1
    with pytest.raises(HostKeyMismatch):
        connect(device)
    # ... but replaces it when told to: by appending the new key and revoking the old one.
    original = known_hosts.read_text()
    assert main(["devices", "trust", "--inventory", str(inventory), "--replace",
                 "--expect", host_fingerprint(farm, "farm-x86"), "farm-x86"]) == 0
    name = f"[{x86.host}]:{x86.port}"
    assert known_hosts.read_text() == original + host_entry(farm, "farm-arm", name, "@revoked") \
        + "\n" + host_entry(farm, "farm-x86", name) + "\n"
    with connect(device) as t:
        assert t.run(["true"], timeout=30).ok
    assert openssh_accepts(device, known_hosts)


def test_insecure_accept_new_records_the_key(farm, tmp_path: Path) -> None:
    known_hosts = tmp_path / "nested" / "known_hosts"
    device = dataclasses.replace(farm.x86, known_hosts=known_hosts, insecure_accept_new=True)
    with connect(device) as t:
        assert t.run(["true"], timeout=30).ok
    recorded = paramiko.HostKeys(str(known_hosts))
    key = recorded.lookup(f"[{device.host}]:{device.port}")["ssh-ed25519"]
    assert key_fingerprint(key) == host_fingerprint(farm, "farm-x86")
    # Once recorded, the key is verified like any other: a strict device accepts it.
    with connect(dataclasses.replace(device, insecure_accept_new=False)) as t:
        assert t.run(["true"], timeout=30).ok


def test_wrong_client_key_is_auth_failed(farm, tmp_path: Path) -> None:
    key = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    with pytest.raises(AuthFailed, match="farm-x86.*refused authentication"):
        connect(dataclasses.replace(farm.x86, key=key))
    with pytest.raises(AuthFailed, match="farm-x86.*cannot read private key"):
        connect(dataclasses.replace(farm.x86, key=tmp_path / "missing"))


def test_nothing_listening_is_unreachable_after_retries(farm) -> None:
    with socket.socket() as s:  # a port that was free a moment ago; nothing listens on it
        s.bind((farm.x86.host, 0))
        port = s.getsockname()[1]
    device = dataclasses.replace(farm.x86, port=port, connect_retries=2)
    with pytest.raises(DeviceUnreachable, match=r"farm-x86.*after 2 attempts"):
        connect(device)
