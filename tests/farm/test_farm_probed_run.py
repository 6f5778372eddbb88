"""probed_run: a fingerprint, the run and a fingerprint in one remote command, on the farm and
the local device. The command's stdout, stderr, exit code, stdin, timeout and quoting must be
exactly what Transport.run gives."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path

import pytest
from fixtures_farm import gone

from devices.cache import ArtifactCache
from devices.connect import connect
from devices.errors import CommandTimeout, TransferFailed
from devices.fingerprint import probe, probed_run
from devices.inventory import Device, local_device


@pytest.fixture
def device(request: pytest.FixtureRequest, farm, tmp_path: Path) -> Device:
    # A workdir of its own: other tests expect the first push of a program to send it.
    name = request.param
    found = local_device() if name == "local" else farm.inventory.get(name)
    return dataclasses.replace(found, workdir=str(tmp_path / f"{name}-work"))


@pytest.mark.parametrize("device", ["farm-x86", "farm-arm", "local"], indirect=True)
def test_output_and_fingerprints_arrive_apart(device: Device, args_program,
                                              tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    nasty = ["two words", f"$(touch {marker})", f"; touch {marker}", "a\nb", ""]
    with connect(device) as t:
        c = ArtifactCache(t)
        remote = c.push(args_program[device.arch])
        started = time.monotonic()
        probed = probed_run(t, [remote, *nasty], timeout=60)
        elapsed = time.monotonic() - started
    assert probed.result.exit_code == 0, probed.result.stderr
    assert probed.result.stdout == f"arch={device.arch}\n" + "".join(f"[{a}]\n" for a in nasty)
    assert probed.result.stderr == ""
    assert 0 < probed.result.wall_s < elapsed
    for fp in (probed.before, probed.after):
        assert fp["device"] == device.name and fp["emulated"] == device.emulated
        assert fp["arch"] == "x86_64" and fp["kernel"] and fp["cores"] and fp["mem_total_kb"]
        assert len(fp["loadavg"]) == 3
    assert probed.before["taken_at"] <= probed.after["taken_at"]
    assert not marker.exists()


@pytest.mark.parametrize("device", ["farm-x86", "local"], indirect=True)
def test_later_runs_on_a_connection_keep_the_static_facts(device: Device) -> None:
    # Only the first probe on a connection reads arch, kernel and /proc/cpuinfo; later ones
    # must still carry them, and read the changing facts themselves.
    with connect(device) as fresh:
        full = probe(fresh)
    with connect(device) as t:
        runs = [probed_run(t, ["true"], timeout=30) for _ in range(3)]
    static = ("arch", "kernel", "cpu_model")
    for fp in [r.before for r in runs] + [r.after for r in runs]:
        assert {k: fp[k] for k in static} == {k: full[k] for k in static}
        assert fp["cpu_model"] and fp["mem_total_kb"] == full["mem_total_kb"]
        assert 0 < fp["mem_available_kb"] <= fp["mem_total_kb"]
        assert [(c["cpu"], c["part"]) for c in fp["cores"]] == [
            (c["cpu"], c["part"]) for c in full["cores"]]
        assert len(fp["loadavg"]) == 3


@pytest.mark.parametrize("device", ["farm-x86", "local"], indirect=True)
def test_stderr_exit_codes_stdin_and_pinning(device: Device, tmp_path: Path) -> None:
    stdin = tmp_path / "in.txt"
    stdin.write_text("line one\nline two\n")
    with connect(device) as t:
        failed = probed_run(t, ["sh", "-c", "echo out; echo oops >&2; exit 3"], timeout=30)
        assert (failed.result.exit_code, failed.result.stdout, failed.result.stderr) == (
            3, "out\n", "oops\n")
        unterminated = probed_run(t, ["sh", "-c", "printf 'no newline' >&2"], timeout=30)
        assert unterminated.result.stderr == "no newline"
        # The command's stderr may even hold what looks like a marker line.
        fake = probed_run(t, ["sh", "-c", "echo 'benchfarm-probe-0 after 0 1 2' >&2"], 30)
        assert fake.result.stderr == "benchfarm-probe-0 after 0 1 2\n"
        counted = probed_run(t, ["wc", "-l"], timeout=30, stdin_file=stdin)
        assert counted.result.stdout.strip() == "2"
        pinned = probed_run(t, ["grep", "Cpus_allowed_list", "/proc/self/status"], 30, cpus=[0])
        assert pinned.result.stdout.split() == ["Cpus_allowed_list:", "0"]
        assert probed_run(t, ["/no/such/program"], timeout=30).result.exit_code == 127
        assert failed.before["cores"] and failed.after["cores"]


@pytest.mark.parametrize("device", ["farm-x86", "local"], indirect=True)
def test_timeout_kills_the_process_group(device: Device) -> None:
    script = "sleep 97.41 & sleep 97.42; wait"
    with connect(device) as t:
        with pytest.raises(CommandTimeout, match=device.name):
            probed_run(t, ["sh", "-c", script], timeout=1.0)
        assert probed_run(t, ["echo", "still usable"], 30).result.stdout == "still usable\n"
    assert gone("97.41") and gone("97.42")


@pytest.mark.parametrize("device", ["farm-x86", "local"], indirect=True)
def test_changed_artifacts_are_pushed_again_before_the_command_runs(
        device: Device, args_program, tmp_path: Path) -> None:
    program = tmp_path / "program"
    shutil.copy(args_program[device.arch], program)
    genuine = program.read_bytes()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 8}')
    (model / "weights.bin").write_text("w" * 64)
    expected = f"arch={device.arch}\n"
    with connect(device) as t:
        c = ArtifactCache(t)
        remote, tree = c.push(program), c.push_tree(model)
        expected += f"[{tree}]\n"
        assert probed_run(t, [remote, tree], timeout=60, cache=c).result.stdout == expected
        sent = c.bytes_sent

        # A cached blob overwritten in place (same size): pushed again before it runs.
        blob = Path(remote)
        blob.chmod(0o755)
        blob.write_bytes(b"#!/bin/sh\necho tampered\n".ljust(len(genuine), b"#"))
        assert probed_run(t, [remote, tree], timeout=60, cache=c).result.stdout == expected
        assert c.bytes_sent == sent + len(genuine)
        assert blob.read_bytes() == genuine

        # A tree entry pointed at another blob: the tree is rebuilt.
        link = Path(tree, "config.json")
        link.unlink()
        link.symlink_to(os.path.realpath(Path(tree, "weights.bin")))
        assert probed_run(t, [remote, tree], timeout=60, cache=c).result.stdout == expected
        assert t.fetch(f"{tree}/config.json").decode() == '{"hidden_size": 8}'

        # Damaged there and changed here since its push: the caller's path is stale.
        blob.chmod(0o755)
        blob.write_bytes(b"x")
        program.write_bytes(genuine + b"\0")
        with pytest.raises(TransferFailed, match=f"{device.name}.*changed here since"):
            probed_run(t, [remote], timeout=60, cache=c)


# The command's ancestors, nearest first: their command lines, one per line.
ANCESTORS = """p=$$
while [ "$p" -gt 1 ]; do
  tr '\\0' ' ' < /proc/$p/cmdline; echo
  set -- $(cat /proc/$p/stat | sed 's/.*) //'); p=$2
done"""


@pytest.mark.parametrize("device", ["farm-x86"], indirect=True)
def test_the_whole_probed_command_gets_the_timeout_and_8_s_only(device: Device) -> None:
    # the run's own deadline, then the whole command's (GNU timeout over SSH; the local device
    # keeps its deadline in Python): timeout + 8 (it was timeout + 60, so a wedged probe or
    # lock held the run for timeout + 68 s)
    with connect(device) as t:
        out = probed_run(t, ["sh", "-c", ANCESTORS], timeout=30).result.stdout
    # (the probe script's own text, `timeout -k 3 "$limit"`, is in an ancestor's line too)
    limits = [line.split()[3] for line in out.splitlines() if line.startswith("timeout -k 3 ")
              and line.split()[3][0].isdigit()]
    assert limits == ["30.0", "38.0"], out
