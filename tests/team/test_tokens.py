"""A user's token file is their own (mode 0600, their uid, a regular file, made so whatever
the umask), and holds a token: 16 characters or more, never blank; `users login` saves only
a token of an active user."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from fixtures_ray import cli_here
from team_cli import Team, make_team

from harness.access.tokens import TOKEN_FILE_ENV, TokenError, read_token_file


@pytest.fixture
def team(tmp_path: Path, capsys: pytest.CaptureFixture[str],
         monkeypatch: pytest.MonkeyPatch) -> Team:
    return make_team(tmp_path, capsys, monkeypatch)


def token_file(folder: Path, text: str, mode: int) -> Path:
    path = folder / "token"
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602])
def test_a_token_file_open_to_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = token_file(tmp_path, "bf_" + "a" * 43, mode)
    with pytest.raises(TokenError, match=rf"open to others \(mode 0{mode:o}\): run `chmod 600 "):
        read_token_file(path)


def test_a_token_file_must_be_its_users_own_regular_file(tmp_path: Path) -> None:
    theirs = token_file(tmp_path, "bf_" + "a" * 43, 0o600)
    os.chown(theirs, 65534, 65534)  # nobody's (these tests run as root: root is no one special)
    with pytest.raises(TokenError, match="belongs to uid 65534, not to you"):
        read_token_file(theirs)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    # no writer: opening it to read would wait for one for ever (this test would hang)
    with pytest.raises(TokenError, match="not a regular file"):
        read_token_file(fifo)
    # a writer holding a token in it: refused, and nothing of it read (the token is still in
    # the pipe: a reader would have taken it, or waited for more until the writer closed)
    token = ("bf_" + "b" * 43).encode()
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        os.write(writer, token)
        with pytest.raises(TokenError, match="not a regular file"):
            read_token_file(fifo)
        assert os.read(writer, 4096) == token
    finally:
        os.close(writer)
    assert read_token_file(tmp_path / "absent") is None


@pytest.mark.parametrize("text", ["", " ", "   \n", "short-token12", " " * 20,
                                  "sixteen chars ok", "é" * 20])
def test_a_short_blank_or_odd_token_in_the_file_is_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(TokenError):
        read_token_file(token_file(tmp_path, text, 0o600))


def test_the_saved_token_file_is_private_whatever_the_umask(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "home" / ".config" / "benchfarm" / "token"
    monkeypatch.setenv(TOKEN_FILE_ENV, str(path))
    old = os.umask(0)
    try:
        done = cli_here(capsys, "--db", f"sqlite:///{tmp_path}/s.db", "users", "add", "ann",
                        "--admin", "--save")
    finally:
        os.umask(old)
    assert done.returncode == 0 and str(path) in done.stdout
    assert "bf_" not in done.stdout + done.stderr  # kept, not shown
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert read_token_file(path).startswith("bf_")


def test_login_saves_a_valid_token_and_refuses_others(team: Team,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    token = team.found("alice", "users", "add", "dave").strip()
    for given, message in (("short", "printable ASCII characters"),
                           ("bf_" + "z" * 43, "no active user's")):
        monkeypatch.setattr("sys.stdin", _stdin(given))
        assert message in team.refused("dave", "users", "login")
    monkeypatch.setattr("sys.stdin", _stdin(token + "\n"))
    assert "saved dave's token" in team.found("dave", "users", "login")
    assert stat.S_IMODE(team.token_file("dave").stat().st_mode) == 0o600
    assert team.found("dave", "users", "whoami").strip() == "dave"


def _stdin(text: str):
    import io

    stream = io.StringIO(text)
    stream.isatty = lambda: False  # type: ignore[method-assign]
    return stream
