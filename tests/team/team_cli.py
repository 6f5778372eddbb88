"""A team on one store, driven through the real command line: each call runs as one user,
presenting that user's token file (``$BENCHFARM_TOKEN_FILE``), in this process."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fixtures_ray import cli_here

from harness.access.tokens import TOKEN_FILE_ENV, write_token_file


@dataclass
class Team:
    folder: Path
    capsys: pytest.CaptureFixture[str]
    monkeypatch: pytest.MonkeyPatch
    tokens: dict[str, Path] = field(default_factory=dict)

    @property
    def db(self) -> list[str]:
        return ["--db", f"sqlite:///{self.folder}/team.db"]

    @property
    def url(self) -> str:
        return self.db[1]

    def token_file(self, user: str) -> Path:
        return self.folder / "homes" / user / "token"

    def as_(self, user: str, *args: str) -> subprocess.CompletedProcess:
        """`benchfarm --db STORE ARGS...` run by ``user`` (their token file; a user without
        one presents a file that does not exist)."""
        self.monkeypatch.setenv(TOKEN_FILE_ENV, str(self.token_file(user)))
        return cli_here(self.capsys, *self.db, *args)

    def found(self, user: str, *args: str) -> str:
        """The output of a command that must succeed."""
        done = self.as_(user, *args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    def refused(self, user: str, *args: str) -> str:
        """The error of a command that must be refused as bad input (exit 2)."""
        done = self.as_(user, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        return done.stderr

    def add(self, admin: str, user: str, *flags: str) -> None:
        """``admin`` adds ``user``, who keeps the printed token in their token file."""
        token = self.found(admin, "users", "add", user, *flags).strip()
        write_token_file(self.token_file(user), token)


def make_team(folder: Path, capsys: pytest.CaptureFixture[str],
              monkeypatch: pytest.MonkeyPatch) -> Team:
    """A store whose first admin is alice (set up by the local user, as the README says), with
    bob and carol as plain users."""
    team = Team(folder, capsys, monkeypatch)
    team.found("alice", "users", "add", "alice", "--admin", "--save")
    team.add("alice", "bob")
    team.add("alice", "carol")
    return team


def inventory(folder: Path) -> list[str]:
    """--inventory of one board, ``local``."""
    path = folder / "inventory.toml"
    path.write_text(f'[[device]]\nname = "local"\nworkdir = "{folder}/work"\n')
    return ["--inventory", str(path)]
