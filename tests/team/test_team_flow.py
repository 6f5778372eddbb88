"""A farm two people share, end to end through the real command line (a process per command)
and the real store: the local user makes the first admin, who adds a second user; each acts
with their own token file; a submit carrying a notification command is refused; a cancel
across users is refused, then done by the admin, who says so; a reservation keeps a board for
its owner, and only they or an admin end it; the audit trail says who did what, for whom; a
revoked token opens nothing. The OS user is root throughout: the store does not care."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fixtures_ray import needle_spec

from db.store import Store

REPO = Path(__file__).resolve().parents[2]


def benchfarm(folder: Path, user: str, *args: str, stdin: str | None = None
              ) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BENCHFARM_")}
    env |= {"PYTHONPATH": str(REPO), "BENCHFARM_DB": f"sqlite:///{folder}/team.db",
            "BENCHFARM_INVENTORY": str(folder / "inventory.toml"),
            "BENCHFARM_TOKEN_FILE": str(folder / user / "token")}
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=folder, env=env,
                          input=stdin, capture_output=True, text=True, timeout=300)


def ok(folder: Path, user: str, *args: str, stdin: str | None = None) -> str:
    done = benchfarm(folder, user, *args, stdin=stdin)
    assert done.returncode == 0, (user, args, done.stdout, done.stderr)
    return done.stdout


def refused(folder: Path, user: str, *args: str) -> str:
    done = benchfarm(folder, user, *args)
    assert done.returncode == 2, (user, args, done.stdout, done.stderr)
    return done.stderr


def test_two_users_share_a_farm(tmp_path: Path, needle_model: Path) -> None:
    (tmp_path / "inventory.toml").write_text(
        f'[[device]]\nname = "local"\nworkdir = "{tmp_path}/work"\n')
    spec = str(needle_spec(tmp_path, "shared", needle_model, ["local"]))

    # set-up: the local user, admin of a store without users, makes alice its first admin
    ok(tmp_path, "alice", "users", "add", "alice", "--admin", "--save")
    assert ok(tmp_path, "alice", "users", "whoami").strip() == "alice"
    token = ok(tmp_path, "alice", "users", "add", "bob").strip()  # shown once, for bob
    assert "saved bob's token" in ok(tmp_path, "bob", "users", "login", stdin=token + "\n")
    assert (tmp_path / "bob" / "token").stat().st_mode & 0o777 == 0o600
    err = refused(tmp_path, "root", "submit", spec)  # no token file: no one
    assert str(tmp_path / "root" / "token") in err and "benchfarm users add" in err

    # each submits as themselves; bob cannot submit as alice
    assert "queued job 1" in ok(tmp_path, "bob", "submit", spec, "--priority", "2")
    assert "queued job 2" in ok(tmp_path, "alice", "submit", spec)
    assert "only an admin" in refused(tmp_path, "bob", "submit", spec, "--owner", "alice")
    # a job carries http(s) URLs only: a command target is refused, and nothing is queued
    owned = tmp_path / "owned"
    for target in (f"touch {owned}", f"file://{owned}"):
        assert "not an http:// or https:// URL" in refused(tmp_path, "bob", "submit", spec,
                                                           "--notify", target)
    assert not owned.exists()

    # a cancel across users: refused for bob, with or without --force; done by alice, saying so
    for flags in ([], ["--force"]):
        assert "job 2 belongs to alice: only alice or an admin" in refused(
            tmp_path, "bob", "cancel", "2", *flags)
    assert "--force" in refused(tmp_path, "alice", "cancel", "1")
    ok(tmp_path, "alice", "cancel", "1", "--force")
    assert "cancelled by alice (--force; the owner is bob)" in ok(tmp_path, "bob", "logs", "1")
    assert "cancelled job 2" in ok(tmp_path, "alice", "cancel", "shared")  # her own, by name
    # reservations: bob keeps the board; alice's own run waits for it, her reserve is refused
    ok(tmp_path, "bob", "reserve", "local", "--for", "2h", "--reason", "release benchmarks")
    assert "reserved by bob" in refused(tmp_path, "alice", "run", spec)
    assert "reserved by bob" in refused(tmp_path, "alice", "reserve", "local", "--for", "1h")
    assert "--force" in refused(tmp_path, "alice", "release", "local")
    assert "was reserved for bob" in ok(tmp_path, "alice", "release", "local", "--force")

    # the audit trail: who did what, for whom
    log = ok(tmp_path, "bob", "users", "log", "--limit", "0")
    rows = [line.split(None, 6)[2:6] for line in log.splitlines()[2:]]
    assert rows[::-1] == [
        ["root", "(local)", "-", "user-add"],
        ["alice", "-", "user-add", "user"],
        ["bob", "-", "submit", "job"],
        ["alice", "-", "submit", "job"],
        ["alice", "bob", "cancel", "job"],
        ["alice", "-", "cancel", "job"],
        ["bob", "-", "reserve", "board"],
        ["alice", "bob", "release", "board"],
    ]
    with Store.open(f"sqlite:///{tmp_path}/team.db") as store:
        jobs = {job.id: job for job in store.jobs.list()}
        assert (jobs[1].owner, jobs[1].cancelled_by) == ("bob", "alice")
        assert (jobs[2].owner, jobs[2].cancelled_by) == ("alice", "alice")
        assert all(e.checked for e in store.audit.entries()[:-1])

    # bob's token revoked: it opens nothing, and says why
    ok(tmp_path, "alice", "users", "revoke", "bob")
    err = refused(tmp_path, "bob", "reserve", "local", "--for", "1h")
    assert "is bob's, revoked" in err and "by alice" in err
