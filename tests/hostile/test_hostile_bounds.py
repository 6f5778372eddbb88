"""Bounds on what one input may cost. A chat template that builds a gigabyte string fails in
its child for want of memory (an address-space limit) instead of taking it; the dashboard
refuses a request body past its cap before the token is looked at; ids, priorities and
durations out of range are exit 2 naming the range (CLI) or 400 (dashboard) instead of an
OverflowError; reasons, owners and messages reach the terminal escaped and cut, and a reason
too long is refused; CSV cells a spreadsheet would run (after leading white space or control
characters) are neutralised and a lone carriage return no longer splits a row. The real CLI,
a real dashboard process, the real store."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from fixtures_cluster import free_port
from fixtures_ray import cli_here, needle_spec
from sqlalchemy import update
from test_hostile_values import reported_with_error

from db import Store
from db.models import BoardState
from harness import REPO_ROOT
from harness.cli import main

TOKEN = "a-token-of-enough-characters-0123"
LOOPBACK = "127.0.0.1"

RENDER = """
import resource, sys
from harness.workloads.chat_template import TemplateFailed, render
try:
    render(sys.argv[1], {})
    outcome = "rendered"
except TemplateFailed as exc:
    outcome = str(exc)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(f"{peak} {outcome}")
"""


def test_a_template_building_a_huge_string_fails_for_memory_in_its_child() -> None:
    # 800 MB without a limit (the "ab" * 3000000000 took 5.7 GB); a real template
    # renders in a few MiB
    done = subprocess.run([sys.executable, "-c", RENDER, '{{ "ab" * 400000000 }}'],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr
    peak_kb, outcome = done.stdout.strip().split(" ", 1)
    assert int(peak_kb) < 600_000, done.stdout  # the child never held the string
    assert "memory" in outcome, outcome


@pytest.fixture
def dashboard(tmp_path: Path):
    url = f"sqlite:///{tmp_path}/web.db"
    Store.open(url).close()
    port = free_port(LOOPBACK)
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "--db", url, "web",
                             "--port", str(port)], stderr=subprocess.DEVNULL,
                            env={**os.environ, "BENCHFARM_WEB_TOKEN": TOKEN,
                                 "PYTHONPATH": str(REPO_ROOT)})
    base = f"http://{LOOPBACK}:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{base}/login", timeout=10).close()
            break
        except (urllib.error.URLError, ConnectionError):
            assert proc.poll() is None and time.monotonic() < deadline, "no dashboard"
            time.sleep(0.2)
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(30)


def answer(conn: socket.socket) -> bytes:
    conn.settimeout(10)
    return conn.recv(4096)


def test_a_body_past_the_cap_is_refused_before_the_login_reads_it(dashboard: int) -> None:
    with socket.create_connection((LOOPBACK, dashboard), timeout=10) as conn:
        conn.sendall(b"POST /login HTTP/1.1\r\nHost: x\r\nContent-Type: application/"
                     b"x-www-form-urlencoded\r\nContent-Length: 400000000\r\n\r\ntoken="
                     + b"a" * 65536)
        assert answer(conn).startswith(b"HTTP/1.1 413"), "the server waited for 400 MB"
    with socket.create_connection((LOOPBACK, dashboard), timeout=10) as conn:  # no length
        conn.sendall(b"POST /login HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            for _ in range(8):  # 256 KiB, then the end
                conn.sendall(b"8000\r\n" + b"a" * 0x8000 + b"\r\n")
            conn.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while sending
        assert answer(conn).startswith(b"HTTP/1.1 413")


def test_a_job_id_beyond_the_store_is_a_bad_request(dashboard: int) -> None:
    request = urllib.request.Request(
        f"http://{LOOPBACK}:{dashboard}/api/jobs/99999999999999999999",
        headers={"Authorization": f"Bearer {TOKEN}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 400
    assert "from 1 to 9223372036854775807" in refused.value.read().decode()


def exit_code(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """main's exit code, argparse's refusals (SystemExit) included, and stderr."""
    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.mark.parametrize("argv, bound", [
    (["wait", "99999999999999999999"], "from 1 to 9223372036854775807"),
    (["logs", "99999999999999999999"], "from 1 to 9223372036854775807"),
    (["cancel", "99999999999999999999"], "from 1 to 9223372036854775807"),
    (["status", "99999999999999999999"], "from 1 to 9223372036854775807"),
    (["reserve", "local", "--for", "infd"], "at most 3650d"),
    (["reserve", "local", "--for", "1e30s"], "at most 3650d"),
    (["gc", "--older-than", "1e30s"], "at most 3650d"),
    (["submit", "SPEC", "--priority", "99999999999999999999"], "from -1000000 to 1000000"),
])
def test_numbers_out_of_range_are_exit_2_naming_the_range(
        tmp_path: Path, needle_model: Path, capsys: pytest.CaptureFixture[str],
        argv: list[str], bound: str) -> None:
    url = f"sqlite:///{tmp_path}/ranges.db"
    Store.open(url).close()
    spec = needle_spec(tmp_path, "ranges", needle_model, ["local"])
    argv = [str(spec) if a == "SPEC" else a for a in argv]
    code, err = exit_code(capsys, "--db", url, *argv)
    assert code == 2 and bound in err, err


HOSTILE = "\r\x1b[2J\x1b]0;owned\x07maintenance? no: online"


def test_reasons_and_owners_reach_the_terminal_escaped_and_cut(
        tmp_path: Path, needle_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/text.db"
    db = ["--db", url]
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(f'[[device]]\nname = "local"\nworkdir = "{tmp_path}/work"\n')
    inv = ["--inventory", str(inventory)]
    assert cli_here(capsys, *db, "devices", "state", "local", "maintenance", "--reason",
                    HOSTILE).returncode == 0
    spec = needle_spec(tmp_path, "text", needle_model, ["local"])
    with Store.open(url) as store:
        store.jobs.add("text", str(spec), spec.read_text(), owner=HOSTILE)
    shown = [cli_here(capsys, *db, *argv) for argv in (
        ["devices", "list", *inv], ["devices", "health", "local", *inv], ["queue"],
        ["logs", "1"])]
    for done in shown:
        assert done.returncode == 0, done.stderr
        assert "\\x1b[2J" in done.stdout, done.stdout
        assert not any(c in done.stdout for c in "\x1b\x07\r"), done.stdout
    # a reason of 120 KB: refused by the command and by the store; one already stored (a
    # row written by hand) is cut where it is shown
    long = "x" * 120_000
    code, err = exit_code(capsys, *db, "devices", "state", "local", "maintenance",
                          "--reason", long)
    assert code == 2 and "at most 500 characters" in err
    code, err = exit_code(capsys, *db, "reserve", "local", "--for", "1h", "--reason", long,
                          *inv)
    assert code == 2 and "at most 500 characters" in err
    with Store.open(url) as store:
        with pytest.raises(Exception, match="at most 500"):
            store.boards.set_state("local", "maintenance", long, "me")
        with store.database.begin() as conn:
            conn.execute(update(BoardState.__table__).values(reason=long))
    done = cli_here(capsys, *db, "devices", "list", *inv)
    assert done.returncode == 0 and len(done.stdout) < 2000, len(done.stdout)
    assert "more characters)" in done.stdout


# what a spreadsheet skips before a formula: white space and control characters
LEADING = "".join(map(chr, range(0x21))) + "\x7f\u00a0"


@pytest.mark.parametrize("error", [
    ' =HYPERLINK("http://evil.example/","x")', '\n=cmd|"/c calc"!A1', "\r\n@SUM(1+1)*cmd",
    "\x07-2+3+cmd", "\u00a0+1+1", "split\rthe row"])
def test_csv_cells_after_white_space_and_lone_carriage_returns(tmp_path: Path,
                                                               error: str) -> None:
    failures, runs = reported_with_error(tmp_path, error)
    assert len(runs) == 2 and len(failures) == 1  # no row split
    # the export keeps the whole error (line breaks as \n), quoted as text
    (cell,) = runs.loc[runs["status"] == "failed", "error"].tolist()
    wanted = error.replace("\r\n", "\n").replace("\r", "\n")
    assert cell == (wanted if error.startswith("split") else f"'{wanted}"), repr(cell)
    # the report's table shows the error's last line: text too
    (cell,) = failures["error"].tolist()
    assert cell.startswith("'") or not cell.lstrip(LEADING).startswith(("=", "+", "-", "@"))
