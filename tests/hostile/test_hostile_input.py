"""Hostile input through the real command line: every case is exit 2 naming what is wrong (or
exit 1 for a store that fails while running), one line on stderr, never a traceback, and the
store keeps what it held."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fixtures_db import add_refs, sample_result

from db import Store
from db.errors import StoreError
from harness.cli import main

SPEC = """name = "hostile"
model = "model"
devices = ["local"]
{extra}
[engine.policy.exact]
[[workload]]
kind = "needle"
ctx = 128
depth = {depth}
"""


def cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) <= 1, err
    return code, err


@pytest.mark.parametrize("extra,depth,key", [
    ("backoff_s = inf", "0.5", "backoff_s"),
    ("timeout_s = nan", "0.5", "timeout_s"),
    ("cooldown_s = -inf", "0.5", "cooldown_s"),
    ("", "nan", "workload[0].depth"),
    ("", "[0.5, inf]", "workload[0].depth"),
])
def test_specs_refuse_non_finite_numbers(spec_dir: Path, capsys, extra: str, depth: str,
                                         key: str, sqlite_url: str) -> None:
    path = spec_dir / "spec.toml"
    path.write_text(SPEC.format(extra=extra, depth=depth))
    code, err = cli(capsys, "--db", sqlite_url, "run", str(path))
    assert code == 2
    assert str(path) in err and f"key '{key}'" in err and "finite" in err
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists()  # refused before anything


def test_claims_refuse_non_finite_numbers(tmp_path: Path, capsys, sqlite_url: str) -> None:
    path = tmp_path / "claims.toml"
    path.write_text('source = "s"\n[[claim]]\nid = "c"\nstatement = "s"\nmetric = "recall"\n'
                    'expected = 1.0\ntolerance = nan\n')
    code, err = cli(capsys, "--db", sqlite_url, "audit", str(path), "--stored-only")
    assert code == 2 and str(path) in err and "key 'tolerance'" in err and "finite" in err


@pytest.mark.parametrize("command", ["run", "audit"])
def test_files_with_a_non_utf8_byte_are_input_errors(spec_dir: Path, capsys, command: str,
                                                     sqlite_url: str) -> None:
    path = spec_dir / "file.toml"
    path.write_bytes(b'name = "caf\xe9"\n')  # Latin-1, not UTF-8
    code, err = cli(capsys, "--db", sqlite_url, command, str(path))
    assert code == 2 and str(path) in err and "UTF-8" in err and "0xe9" in err


@pytest.fixture
def stored(sqlite_url: str) -> str:
    with Store.open(sqlite_url) as store:
        store.save_run(sample_result(add_refs(store, experiment="e1"), "a" * 64, steps=3))
    return sqlite_url


@pytest.mark.parametrize("argv", [["runs", "show"], ["reproduce"]])
@pytest.mark.parametrize("run", ["9223372036854775808", "9" * 40, "\u00b2"])
def test_run_numbers_beyond_any_row_id_are_unknown_runs(stored: str, capsys, argv: list[str],
                                                        run: str) -> None:
    code, err = cli(capsys, "--db", stored, *argv, run)
    assert code == 2 and "no run with id or key" in err


def test_inventory_refuses_resources_ray_defines(tmp_path: Path, capsys) -> None:
    path = tmp_path / "inventory.toml"
    path.write_text('[[device]]\nname = "b"\nhost = "127.0.0.1"\narch = "x86_64"\n'
                    "resources = {CPU = 100}\n")
    code, err = cli(capsys, "devices", "list", "--inventory", str(path))
    assert code == 2 and str(path) in err and "key 'resources'" in err and "'CPU'" in err


@contextmanager
def tmpfs(folder: Path, options: str) -> Iterator[Path]:
    """A real tmpfs mounted on ``folder`` for the duration (mounting needs root)."""
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder nothing can be written into: a read-only tmpfs for root (whom permission bits
    do not stop), else a folder without write permission."""
    if os.geteuid() == 0:
        with tmpfs(tmp_path / "ro", "ro,size=1m") as folder:
            yield folder
    else:
        folder = tmp_path / "ro"
        folder.mkdir(mode=0o555)
        yield folder


def test_report_out_onto_a_file_or_a_read_only_folder(stored: str, tmp_path: Path,
                                                      read_only_dir: Path, capsys) -> None:
    a_file = tmp_path / "taken"
    a_file.write_text("keep me\n")
    for out in (a_file, a_file / "below", read_only_dir, read_only_dir / "sub"):
        code, err = cli(capsys, "--db", stored, "report", "e1", "--out", str(out))
        assert code == 2 and f"--out {out}" in err, err
    assert a_file.read_text() == "keep me\n"
    code, _ = cli(capsys, "--db", stored, "report", "e1", "--out", str(tmp_path / "fine"))
    assert code == 0 and (tmp_path / "fine" / "report.md").is_file()


def test_audit_out_on_a_read_only_folder_is_refused_before_running(
        stored: str, read_only_dir: Path, capsys) -> None:
    claims = Path(__file__).resolve().parents[2] / "claims" / "seed_000_sparse_topk.toml"
    code, err = cli(capsys, "--db", stored, "audit", str(claims), "--stored-only",
                    "--out", str(read_only_dir))
    assert code == 2 and f"--out {read_only_dir}" in err


def corrupt(path: Path) -> None:
    """Overwrite every third page after the first two with garbage (the header stays)."""
    size = path.stat().st_size
    with path.open("r+b") as f:
        for offset in range(8192, size, 3 * 4096):
            f.seek(offset)
            f.write(b"\xde\xad\xbe\xef" * 1024)


def test_a_corrupted_sqlite_file_is_one_line_and_exit_1(tmp_path: Path, capsys) -> None:
    path = tmp_path / "store.db"
    with Store.open(f"sqlite:///{path}") as store:
        refs = add_refs(store, experiment="e1")
        for i in range(100):
            store.save_run(sample_result(refs, f"{i:064x}", steps=20))
    corrupt(path)
    for argv in (["status"], ["runs", "list"], ["report", "e1", "--out", str(tmp_path / "r")]):
        code, err = cli(capsys, "--db", f"sqlite:///{path}", *argv)
        assert code == 1 and "malformed" in err and str(path.name) in err, err


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB file system to fill (a tmpfs; mounting needs root, as CI runs)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    with tmpfs(tmp_path / "small", "size=2m") as folder:
        yield folder


def test_a_full_disk_fails_the_write_cleanly_and_keeps_whole_runs(small_fs: Path) -> None:
    url = f"sqlite:///{small_fs}/store.db"
    saved: list[str] = []
    with Store.open(url) as store:
        refs = add_refs(store, experiment="e1")
        filler = small_fs / "filler"
        free = shutil.disk_usage(small_fs).free
        # leave the store 256 KiB: a few runs (the first write of a store touches a page of
        # each table and index a run has), then a full disk
        filler.write_bytes(b"\0" * max(free - 256 * 1024, 0))
        with pytest.raises(StoreError) as caught:
            for i in range(1000):
                key = f"{i:064x}"
                store.save_run(sample_result(refs, key, steps=200))
                saved.append(key)
        message = str(caught.value)
        assert caught.value.exit_code == 1 and "\n" not in message
        assert "full" in message and "rolled back" in message
        filler.unlink()
        assert saved, "nothing fitted before the disk was full"
        assert store.completed_run_keys() == set(saved)  # whole runs only, none half-written
        runs = store.frames("e1")["runs"]
        assert len(runs) == len(saved)
