"""Transports against the real local farm (and the local device): push, run, fetch, the
content-addressed cache, timeouts and shell-injection safety."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from fixtures_farm import gone

from devices.cache import ArtifactCache, local_sha256
from devices.connect import connect
from devices.errors import CommandTimeout, TransferFailed
from devices.inventory import Device, local_device
from devices.transport import MAX_OUTPUT_BYTES

NODES = ["farm-x86", "farm-arm", "local"]


@pytest.fixture
def device(request: pytest.FixtureRequest, farm, tmp_path: Path) -> Device:
    name = request.param
    if name == "local":
        return dataclasses.replace(local_device(), workdir=str(tmp_path / "local-work"))
    return farm.inventory.get(name)


def on_disk(device: Device, remote_path: str) -> Path:
    """Every farm node's workdir is on this machine, so a test can inspect or damage it."""
    return Path(remote_path)


@pytest.mark.parametrize("device", NODES, indirect=True)
def test_push_run_fetch_and_second_push_sends_nothing(device: Device, args_program) -> None:
    binary = args_program[device.arch]
    # The farm is shared by the whole session: start from a cold cache for this program.
    (Path(device.workdir) / "cache" / local_sha256(binary)).unlink(missing_ok=True)
    with connect(device) as t:
        c = ArtifactCache(t)
        remote = c.push(binary)
        first = c.last_push
        assert first.status == "sent" and first.bytes_sent == binary.stat().st_size > 0
        assert remote == f"{device.workdir}/cache/{first.sha256}"

        assert c.push(binary) == remote
        assert (c.last_push.status, c.last_push.bytes_sent) == ("cached", 0)

        result = t.run([remote, "hello", "two words"], timeout=60)
        assert result.exit_code == 0, result.stderr
        assert result.stdout == f"arch={device.arch}\n[hello]\n[two words]\n"
        assert t.fetch(remote) == binary.read_bytes()
        assert c.bytes_sent == first.bytes_sent


@pytest.mark.parametrize("device", NODES, indirect=True)
def test_tampered_cached_artifact_is_detected_and_replaced(device: Device, tmp_path: Path) -> None:
    artifact = tmp_path / "ids.txt"
    artifact.write_text("151644 872 198 " * 100)
    with connect(device) as t:
        c = ArtifactCache(t)
        remote = c.push(artifact)
        cached = on_disk(device, remote)
        cached.chmod(0o644)
        cached.write_text("151644 872 199 " * 100)  # same size, one token changed

        assert c.push(artifact) == remote
        assert c.last_push.status == "repaired"
        assert c.last_push.bytes_sent == artifact.stat().st_size
        assert t.fetch(remote) == artifact.read_bytes()

        # Verified blobs are not re-hashed while unchanged, but any write changes the ctime,
        # even when size and mtime are forged back.
        assert c.push(artifact) == remote and c.last_push.status == "cached"
        stat = cached.stat()
        cached.write_text("151644 872 197 " * 100)
        os.utime(cached, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        c.push(artifact)
        assert c.last_push.status == "repaired"
        assert cached.read_bytes() == artifact.read_bytes()

        cached.unlink()  # a vanished artifact is simply sent again
        c.push(artifact)
        assert c.last_push.status == "sent"
        assert cached.read_bytes() == artifact.read_bytes()


@pytest.mark.parametrize("device", NODES, indirect=True)
def test_push_tree_is_content_addressed_and_names_cannot_inject(device: Device,
                                                                tmp_path: Path) -> None:
    # File names cannot hold "/", so the injected command would create "pwned" in the cwd of
    # whatever shell ran it: somewhere under the workdir.
    model = tmp_path / "model"
    (model / "sub dir").mkdir(parents=True)
    files = {
        "config.json": '{"hidden_size": 8}',
        "model.safetensors": "weights" * 50,
        "$(touch pwned)": "a",
        "sub dir/;touch pwned;`touch pwned`": "b",
        "-n": "c",
    }
    for rel, text in files.items():
        (model / rel).write_text(text)
    with connect(device) as t:
        c = ArtifactCache(t)
        tree = c.push_tree(model)
        assert c.last_push.status == "sent"
        for rel, text in files.items():
            assert t.fetch(f"{tree}/{rel}").decode() == text
        cat = t.run_host(["cat", "--", f"{tree}/config.json", f"{tree}/$(touch pwned)"], 30)
        assert cat.stdout == files["config.json"] + "a"

        assert c.push_tree(model) == tree
        assert (c.last_push.status, c.last_push.bytes_sent) == ("cached", 0)

        # A damaged blob is repaired; a changed directory gets a new tree.
        blob = on_disk(device, os.path.realpath(f"{tree}/config.json"))
        blob.chmod(0o644)
        blob.write_text("{}")
        assert c.push_tree(model) == tree and c.last_push.status == "repaired"
        assert t.fetch(f"{tree}/config.json").decode() == files["config.json"]
        (model / "tokenizer.json").write_text("{}")
        assert c.push_tree(model) != tree
    assert not list(Path(device.workdir).rglob("pwned"))
    assert not list(tmp_path.rglob("pwned"))


@pytest.mark.parametrize("device", NODES, indirect=True)
def test_shell_metacharacters_in_parameters_are_passed_literally(device: Device, args_program,
                                                                 tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    nasty = [f"$(touch {marker})", f"`touch {marker}`", f"; touch {marker}",
             f"| touch {marker}", f"&& touch {marker}", f"'\"; touch {marker}", "a\nb", "*", "~",
             "$HOME", ""]
    # A workdir with metacharacters is quoted too.
    device = dataclasses.replace(device, workdir=f"{device.workdir}/w $(touch {marker});x")
    with connect(device) as t:
        c = ArtifactCache(t)
        remote = c.push(args_program[device.arch])
        result = t.run([remote, *nasty], timeout=60)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"arch={device.arch}\n" + "".join(f"[{a}]\n" for a in nasty)
    assert not marker.exists()


def test_exec_prefix_elements_are_quoted(farm, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    device = dataclasses.replace(farm.x86, exec_prefix=[f"env;touch {marker}"])
    with connect(device) as t:
        result = t.run(["true"], timeout=30)
    assert result.exit_code == 127  # no program has that name; nothing else ran
    assert not marker.exists()


@pytest.mark.parametrize("device", ["farm-x86", "local"], indirect=True)
def test_timeout_kills_the_whole_process_group(device: Device) -> None:
    # Two distinctive sleeps: one in the background, one in the foreground.
    script = "sleep 97.31 & sleep 97.32; wait"
    with connect(device) as t:
        with pytest.raises(CommandTimeout, match=device.name):
            t.run(["sh", "-c", script], timeout=1.0)
        assert t.run(["echo", "still usable"], timeout=30).stdout == "still usable\n"
    assert gone("97.31") and gone("97.32")


@pytest.mark.parametrize("device", ["farm-x86", "local"], indirect=True)
def test_pinning_stdin_and_exit_codes(device: Device, tmp_path: Path) -> None:
    stdin = tmp_path / "in.txt"
    stdin.write_text("line one\nline two\n")
    with connect(device) as t:
        pinned = t.run(["grep", "Cpus_allowed_list", "/proc/self/status"], timeout=30, cpus=[0])
        assert pinned.stdout.split() == ["Cpus_allowed_list:", "0"]
        assert t.run(["wc", "-l"], timeout=30, stdin_file=stdin).stdout.strip() == "2"
        failed = t.run(["sh", "-c", "echo oops >&2; exit 3"], timeout=30)
        assert (failed.exit_code, failed.stderr) == (3, "oops\n")
        assert t.run(["/no/such/program"], timeout=30).exit_code == 127


@pytest.mark.parametrize("device", ["farm-x86", "local"], indirect=True)
def test_fetch_of_a_missing_file_is_a_transfer_error(device: Device) -> None:
    with connect(device) as t, pytest.raises(TransferFailed, match=device.name):
        t.fetch("no/such/file")


@pytest.mark.parametrize("device", ["farm-x86", "local"], indirect=True)
def test_a_flood_of_output_is_kept_only_up_to_the_cap(device: Device) -> None:
    flood = MAX_OUTPUT_BYTES + 3 * 1024 * 1024
    script = f"head -c {flood} /dev/zero | tr '\\0' x; echo done >&2"
    with connect(device) as t:
        result = t.run(["sh", "-c", script], timeout=120)
    assert result.exit_code == 0 and result.stderr == "done\n"
    assert len(result.stdout) == MAX_OUTPUT_BYTES and set(result.stdout) == {"x"}


@pytest.mark.parametrize("device", NODES, indirect=True)
@pytest.mark.parametrize("in_the_way", ["directory", "symlink to a directory"])
def test_a_directory_or_symlink_at_a_cached_path_is_replaced_by_the_file(
        device: Device, args_program, tmp_path: Path, in_the_way: str) -> None:
    binary = args_program[device.arch]
    outside = tmp_path / "outside"
    outside.mkdir()
    with connect(device) as t:
        c = ArtifactCache(t)
        cached = on_disk(device, c.push(binary))
        cached.unlink()
        if in_the_way == "directory":
            cached.mkdir()
            (cached / "left-over").write_text("x")
        else:
            cached.symlink_to(outside, target_is_directory=True)
        remote = c.push(binary)
        assert c.last_push.status == "repaired"
        # the upload replaced the entry: a regular file in the cache, nothing moved elsewhere
        assert cached.is_file() and not cached.is_symlink()
        assert cached.read_bytes() == binary.read_bytes()
        assert list(outside.iterdir()) == []
        result = t.run([remote, "ok"], timeout=60)
        assert result.exit_code == 0 and "[ok]" in result.stdout, result.stderr
        assert c.push(binary) == remote and c.last_push.status == "cached"
