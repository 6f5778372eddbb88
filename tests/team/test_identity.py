"""Who acts on a shared farm is who the store checks, not who a flag says: each defect a
hostile probe found, on the real command line and a real store (a user is one token file;
these tests run as root, which is no one special)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures_ray import cli_here, needle_spec
from team_cli import Team, inventory, make_team

from db.store import Store
from harness.access.caller import local_user
from harness.access.tokens import TOKEN_FILE_ENV


@pytest.fixture
def team(tmp_path: Path, capsys: pytest.CaptureFixture[str],
         monkeypatch: pytest.MonkeyPatch) -> Team:
    return make_team(tmp_path, capsys, monkeypatch)


def spec_of(team: Team, needle_model: Path) -> str:
    return str(needle_spec(team.folder, "team-demo", needle_model, ["local"]))


def test_owner_flag_no_longer_makes_anyone_someone_else(team: Team, needle_model: Path) -> None:
    spec, inv = spec_of(team, needle_model), inventory(team.folder)
    err = team.refused("bob", "submit", spec, "--owner", "alice", *inv)
    assert "--owner alice: only an admin may act for someone else (you are bob" in err
    err = team.refused("bob", "reserve", "local", "--for", "1h", "--owner", "alice", *inv)
    assert "only an admin" in err
    assert "owner bob)" in team.found("bob", "submit", spec, *inv)  # as himself: fine
    with Store.open(team.url) as store:
        assert [job.owner for job in store.jobs.list()] == ["bob"]
        assert store.boards.reservations() == {}
    # an admin may, and it is recorded as hers, for alice's colleague
    assert "owner carol)" in team.found("alice", "submit", spec, "--owner", "carol", *inv)
    with Store.open(team.url) as store:
        submitted = store.audit.entries(limit=1)[0]
    assert (submitted.actor, submitted.action, submitted.acting_for, submitted.checked) == (
        "alice", "submit", "carol", True)


def test_no_token_no_action_once_the_store_has_users(team: Team, needle_model: Path) -> None:
    spec, inv = spec_of(team, needle_model), inventory(team.folder)
    err = team.refused("mallory", "submit", spec, *inv)  # root, without a token file
    assert str(team.token_file("mallory")) in err and "`benchfarm users add NAME`" in err
    assert "needs your token" in err
    team.token_file("mallory").parent.mkdir(parents=True)
    team.token_file("mallory").write_text("bf_" + "x" * 43 + "\n")
    team.token_file("mallory").chmod(0o600)
    err = team.refused("mallory", "reserve", "local", "--for", "1h", *inv)
    assert "is no user's of this store" in err and "`benchfarm users add NAME`" in err
    with Store.open(team.url) as store:
        assert store.jobs.count() == 0 and store.boards.reservations() == {}


def test_nobody_releases_another_users_reservation_without_being_an_admin(
        team: Team) -> None:
    inv = inventory(team.folder)
    team.found("carol", "reserve", "local", "--for", "2h", "--reason", "release run", *inv)
    for flags in ([], ["--force"]):  # root's OS account is no one's: bob is bob
        err = team.refused("bob", "release", "local", *flags, *inv)
        assert "the reservation of local belongs to carol: only carol or an admin" in err
    with Store.open(team.url) as store:
        assert store.boards.reservations()["local"].owner == "carol"
    err = team.refused("alice", "release", "local", *inv)  # an admin, saying so
    assert "--force" in err
    assert "released (was reserved for carol)" in team.found("alice", "release", "local",
                                                               "--force", *inv)
    with Store.open(team.url) as store:
        released = store.audit.entries(limit=1)[0]
        assert store.boards.reservations() == {}
    assert (released.actor, released.action, released.target, released.acting_for) == (
        "alice", "release", "board local", "carol")


def test_nobody_shortens_another_users_reservation(team: Team) -> None:
    inv = inventory(team.folder)
    team.found("carol", "reserve", "local", "--for", "2h", *inv)
    with Store.open(team.url) as store:
        ends = store.boards.reservations()["local"].ends
    team.refused("bob", "reserve", "local", "--for", "1s", "--owner", "carol", *inv)
    err = team.refused("bob", "reserve", "local", "--for", "1s", *inv)
    assert "reserved by carol" in err
    with Store.open(team.url) as store:
        assert store.boards.reservations()["local"].ends == ends


def test_who_did_it_is_recorded(team: Team, needle_model: Path) -> None:
    spec, inv = spec_of(team, needle_model), inventory(team.folder)
    team.found("bob", "submit", spec, *inv)
    err = team.refused("carol", "cancel", "1", "--force")
    assert "job 1 belongs to bob: only bob or an admin may cancel it" in err
    team.found("alice", "cancel", "1", "--force")
    team.found("bob", "devices", "state", "local", "maintenance", "--reason", "new fan", *inv)
    with Store.open(team.url) as store:
        assert store.jobs.get(1).cancelled_by == "alice"
        assert store.boards.states(["local"])["local"].changed_by == "bob"
        done = [(e.actor, e.action, e.target, e.acting_for)
                for e in reversed(store.audit.entries())]
    assert done[-3:] == [("bob", "submit", "job 1", None), ("alice", "cancel", "job 1", "bob"),
                         ("bob", "board-state", "board local", None)]
    log = team.found("carol", "users", "log", "--user", "bob")
    assert [line.split()[2:4] for line in log.splitlines()[2:]] == [
        ["bob", "-"], ["alice", "bob"], ["bob", "-"]]


def test_a_store_without_users_is_the_local_users(tmp_path: Path, needle_model: Path,
                                                   capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """No set-up: the local OS user is the admin and a token file is never read (not even
    an unsafe one)."""
    monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "open-token"))
    (tmp_path / "open-token").write_text("whatever")
    (tmp_path / "open-token").chmod(0o644)
    db = ["--db", f"sqlite:///{tmp_path}/solo.db"]
    spec = str(needle_spec(tmp_path, "solo", needle_model, ["local"]))
    inv = inventory(tmp_path)
    done = cli_here(capsys, *db, "submit", spec, "--owner", "ann", *inv)
    assert done.returncode == 0 and "owner ann)" in done.stdout
    done = cli_here(capsys, *db, "cancel", "1", "--force")
    assert done.returncode == 0
    with Store.open(db[1]) as store:
        cancel = store.audit.entries(limit=1)[0]
    assert (cancel.actor, cancel.checked, cancel.acting_for) == (local_user(), False, "ann")
    assert " (local)" in cli_here(capsys, *db, "users", "log").stdout


def test_revoked_tokens_open_nothing_and_the_last_admin_stays(team: Team) -> None:
    inv = inventory(team.folder)
    team.refused("bob", "users", "revoke", "carol")  # only admins
    assert "needs an admin" in team.refused("bob", "users", "add", "eve")
    team.found("alice", "users", "revoke", "bob")
    err = team.refused("bob", "reserve", "local", "--for", "1h", *inv)
    assert "is bob's, revoked" in err and "by alice" in err
    err = team.refused("alice", "users", "revoke", "alice")
    assert "last active admin" in err
    old = team.token_file("bob").rename(team.folder / "bob-old-token")
    team.add("alice", "bob")  # bob again, with a new token
    assert team.found("bob", "users", "whoami").strip() == "bob"
    team.token_file("bob").unlink()
    old.rename(team.token_file("bob"))  # the old one stays dead
    err = team.refused("bob", "reserve", "local", "--for", "1h", *inv)
    assert "no user's of this store" in err
