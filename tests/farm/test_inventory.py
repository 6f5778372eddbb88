"""Inventory loading and validation: good files load, bad ones name file, device and key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devices.boardlock import LOCK_FILE, LockHolder
from devices.errors import InventoryError
from devices.inventory import load_inventory
from harness.engines.lmc.output import parse

GOOD = """
[[device]]
name = "rk1"
host = "10.0.0.21"
port = 2222
user = "bench_user"
key = "keys/id_ed25519"
arch = "aarch64"
class = "rk3588"
cpus = [4, 5, 6, 7]
threads = 4
workdir = "/home/bench/benchfarm"
resources = { gateway-a = 1 }

[[device]]
name = "rk2"
host = "rk2.lab"
arch = "aarch64"
class = "rk3588"

[[device]]
name = "x86-1"
host = "10.0.0.5"
arch = "x86_64"

[[device]]
name = "local"
threads = 2
workdir = "/tmp/benchfarm-local-test"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inv.toml"
    path.write_text(text)
    return path


def test_good_inventory_loads_with_defaults_and_resolved_paths(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    inv = load_inventory(path)
    assert inv.names() == ["local", "rk1", "rk2", "x86-1"]
    rk1 = inv.get("rk1")
    assert (rk1.host, rk1.port, rk1.user, rk1.cls, rk1.cpus) == (
        "10.0.0.21", 2222, "bench_user", "rk3588", [4, 5, 6, 7])
    assert rk1.key == tmp_path / "keys" / "id_ed25519"  # relative to the inventory file
    assert rk1.resources == {"gateway-a": 1.0}
    assert rk1.engine_threads == 4
    rk2 = inv.get("rk2")
    assert (rk2.port, rk2.cpus, rk2.exec_prefix, rk2.emulated) == (22, None, [], False)
    assert inv.get("x86-1").cls == "x86_64"  # class defaults to the arch
    local = inv.get("local")
    assert local.is_local and local.arch == os.uname().machine
    assert (local.threads, local.workdir) == (2, "/tmp/benchfarm-local-test")


def test_local_always_exists_without_a_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("BENCHFARM_INVENTORY", raising=False)
    monkeypatch.chdir(tmp_path)  # no ./farm-state/inventory.toml here
    inv = load_inventory(None)
    assert inv.names() == ["local"]
    assert inv.select(["local"])[0].is_local


LOCAL_BOARDS = """
[[device]]
name = "here-1"
transport = "local"
cpus = [0]
workdir = "{folder}/here-1"
exec_prefix = ["sh", "{standin}", "0"]

[[device]]
name = "here-2"
transport = "local"
class = "here"

[[device]]
name = "rk1"
host = "10.0.0.21"
arch = "aarch64"
transport = "ssh"
"""


def test_boards_on_this_machine_beyond_local(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("BENCHFARM_LOCAL_WORKDIR", str(tmp_path / "local-work"))
    standin = Path(__file__).resolve().parents[2] / "bench" / "standin.sh"
    inv = load_inventory(write(tmp_path, LOCAL_BOARDS.format(folder=tmp_path, standin=standin)))
    assert inv.names() == ["local", "here-1", "here-2", "rk1"]
    one, two = inv.get("here-1"), inv.get("here-2")
    machine = os.uname().machine
    assert one.is_local and two.is_local and not inv.get("rk1").is_local
    assert (one.transport, one.host, one.arch, one.cls, one.cpus, one.address) == (
        "local", None, machine, machine, [0], "local")  # the class defaults to the arch
    assert one.workdir == f"{tmp_path}/here-1"
    assert two.workdir == str(tmp_path / "cache" / "benchfarm" / "here-2")  # a default each
    assert two.cls == "here" and [d.name for d in inv.select(["here"])] == ["here-2"]
    # `local` is as it was: its own workdir variable, class `local`, the only one it selects
    local = inv.get("local")
    assert (local.transport, local.cls, local.workdir) == ("local", "local",
                                                           str(tmp_path / "local-work"))
    assert [d.name for d in inv.select(["local"])] == ["local"]

    # what reaches a board follows its transport, not its name: no SSH, no credentials
    from devices.connect import connect
    from devices.fingerprint import probed_run
    from devices.local import LocalTransport
    from harness.execution.credentials import Credentials

    assert Credentials.of(one) == Credentials(None, None)
    assert Credentials(None, None).install(one) == (one, None)
    with connect(one) as transport:
        assert isinstance(transport, LocalTransport)
        probed = probed_run(transport, ["/nonexistent/lmc", "generate", "--prompt", "-"],
                            timeout=30, lock=LockHolder("test", "test", None, "run-1"))
    assert probed.result.ok, probed.result.stderr
    assert parse(probed.result.stdout, "generate")["tokens"] == [11, 12]  # the stand-in's
    assert probed.before["device"] == probed.after["device"] == "here-1"
    assert probed.before["arch"] == machine
    assert "run=run-1" in (tmp_path / "here-1" / LOCK_FILE).read_text()  # its own lock file


def test_select_by_name_and_class_in_order_without_repeats(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, GOOD))
    assert [d.name for d in inv.select(["x86-1", "rk3588", "rk1"])] == ["x86-1", "rk1", "rk2"]
    assert [d.name for d in inv.select([])] == inv.names()
    with pytest.raises(InventoryError, match=r"no device or class named 'rk9'.*classes: "):
        inv.select(["rk9"])
    with pytest.raises(InventoryError, match="no device named 'nope'"):
        inv.get("nope")


BAD_CASES = [
    # (inventory text, expected fragments of the message)
    ('[[device]]\nname = "a"\nhost = "h"\narch = "aarch64"\ncolour = "red"\n',
     ["device 'a'", "key 'colour'", "unknown key", "allowed: name, host"]),
    ('[[device]]\nname = "a"\nhost = "h"\narch = "aarch64"\nport = "22"\n',
     ["device 'a'", "key 'port'", "expected an integer from 1 to 65535"]),
    ('[[device]]\nname = "a"\nhost = "h"\narch = "armv7"\n',
     ["device 'a'", "key 'arch'", "one of x86_64, aarch64"]),
    ('[[device]]\nname = "a;rm -rf /"\nhost = "h"\narch = "aarch64"\n',
     ["device #1", "key 'name'", "[a-z0-9][a-z0-9._-]*"]),
    ('[[device]]\nname = "Board"\nhost = "h"\narch = "aarch64"\n',
     ["device #1", "key 'name'"]),
    ('[[device]]\nname = "a"\nhost = "h"\narch = "x86_64"\n'
     '[[device]]\nname = "a"\nhost = "h2"\narch = "x86_64"\n',
     ["device 'a'", "key 'name'", "duplicate"]),
    ('[[device]]\nname = "a"\narch = "x86_64"\n', ["device 'a'", "key 'host'", "missing"]),
    ('[[device]]\nname = "a"\nhost = "h"\narch = "x86_64"\ncpus = [1, 1]\n',
     ["key 'cpus'", "distinct"]),
    ('[[device]]\nname = "a"\nhost = "h"\narch = "x86_64"\ncpus = [0, 1]\nthreads = 4\n',
     ["key 'threads'", "exceed the 2 pinned cpus"]),
    ('[[device]]\nname = "a"\nhost = "h"\narch = "x86_64"\nworkdir = "relative/dir"\n',
     ["key 'workdir'", "absolute path"]),
    ('[[device]]\nname = "a"\nhost = "h"\narch = "x86_64"\nexec_prefix = "qemu"\n',
     ["key 'exec_prefix'", "list of non-empty strings"]),
    ('[[device]]\nname = "a"\nhost = "h"\narch = "x86_64"\nemulated = 1\n',
     ["key 'emulated'", "true or false"]),
    ('[[device]]\nname = "a"\nhost = "-oProxyCommand=x"\narch = "x86_64"\n',
     ["key 'host'", "host name or IP"]),
    ('[[device]]\nname = "local"\nhost = "h"\n', ["device 'local'", "key 'host'", "not allowed"]),
    ('[[device]]\nname = "local"\n[[device]]\nname = "local"\n',
     ["device 'local'", "duplicate"]),
    ('[[device]]\nname = "local"\ntransport = "ssh"\n',
     ["device 'local'", "key 'transport'", "its transport is 'local'"]),
    ('[[device]]\nname = "a"\ntransport = "telnet"\n',
     ["device 'a'", "key 'transport'", "one of 'ssh', 'local'"]),
    ('[[device]]\nname = "a"\ntransport = "local"\nhost = "h"\n',
     ["device 'a'", "key 'host'", "not allowed with transport = 'local'"]),
    ('[[device]]\nname = "a"\ntransport = "local"\narch = "x86_64"\n',
     ["device 'a'", "key 'arch'", "not allowed with transport = 'local'"]),
    ('[[device]]\nname = "a"\ntransport = "local"\nkey = "id"\n',
     ["device 'a'", "key 'key'", "not allowed"]),
    ('[[device]]\nname = "a"\ntransport = "local"\nworkdir = "/tmp/bf-same"\n'
     '[[device]]\nname = "b"\ntransport = "local"\nworkdir = "/tmp/bf-same/"\n',
     ["device 'b'", "key 'workdir'", "also the workdir of device 'a'"]),
    ('[[device]]\nname = "local"\nworkdir = "/tmp/bf-same"\n'
     '[[device]]\nname = "a"\ntransport = "local"\nworkdir = "/tmp/bf-same"\n',
     ["device 'a'", "key 'workdir'", "also the workdir of device 'local'"]),
    ('[devices]\nname = "a"\n', ["unknown top-level key 'devices'"]),
    ('device = "a"\n', ["key 'device' must be an array of tables"]),
    ('[[device]]\nname = "a"\nhost = \n', ["not valid TOML"]),
]


@pytest.mark.parametrize(("text", "fragments"), BAD_CASES)
def test_malformed_inventory_errors_name_file_device_key(tmp_path: Path, text: str,
                                                         fragments: list[str]) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    message = str(info.value)
    assert message.startswith(str(path))
    for fragment in fragments:
        assert fragment in message
    assert InventoryError.exit_code == 2


def test_missing_inventory_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="cannot read inventory"):
        load_inventory(tmp_path / "absent.toml")


def test_cli_reports_inventory_errors_with_exit_code_2(tmp_path: Path, capsys) -> None:
    from harness.cli import main

    path = write(tmp_path, '[[device]]\nname = "a"\nhost = "h"\narch = "x86_64"\nport = 0\n')
    assert main(["devices", "list", "--inventory", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"benchfarm: error: {path}: device 'a': key 'port'" in err


def test_shipped_example_inventory_is_valid() -> None:
    inv = load_inventory(Path(__file__).resolve().parents[2] / "devices" / "example.toml")
    assert [d.name for d in inv.select(["rk3588"])] == ["rk3588-a", "rk3588-b"]
    assert inv.get("rk3588-a").key == Path.home() / ".ssh" / "benchfarm_ed25519"
