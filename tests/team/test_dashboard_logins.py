"""The dashboard's logins: a single operator's shared token is 16 characters or more and never
blank (one space, and the form's ``+`` that decodes to it, opened the dashboard beyond
loopback), and once the store has users each request carries one's token (a revoked one is
refused at once), on loopback too; beyond loopback the users' tokens are enough.

Only names older than the users are imported at the top: each defect here fails, not stops,
on the code before them."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import uvicorn
from fixtures_ray import cli_here
from fixtures_web import serving

from db.store import Store
from harness.commands.web import listening_socket
from harness.errors import InputError
from harness.web.app import create_app

SHARED = "a-shared-token-of-the-operator"


@pytest.fixture
def team(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    from team_cli import make_team

    return make_team(tmp_path, capsys, monkeypatch)


def never_served(*_args: object, **_kwargs: object) -> None:
    raise AssertionError("the dashboard started")


@pytest.mark.parametrize("token", [" ", "", "+", "          ", "short-token12"])
def test_a_blank_or_short_dashboard_token_is_refused(tmp_path: Path, token: str,
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    db = ["--db", f"sqlite:///{tmp_path}/web.db"]
    monkeypatch.delenv("BENCHFARM_WEB_TOKEN", raising=False)
    monkeypatch.setattr(uvicorn.Server, "run", never_served)
    done = cli_here(capsys, *db, "web", "--host", "0.0.0.0", "--port", "0", "--token", token)
    assert done.returncode == 2 and "a token must be 16 to 1024" in done.stderr
    monkeypatch.setenv("BENCHFARM_WEB_TOKEN", token)
    done = cli_here(capsys, *db, "web", "--host", "0.0.0.0", "--port", "0")
    if token:  # an empty variable is no token at all: refused beyond loopback as before
        assert done.returncode == 2 and "a token must be 16 to 1024" in done.stderr
    else:
        assert done.returncode == 2 and "needs a token" in done.stderr
    with pytest.raises(InputError, match="a token must be 16 to 1024"):
        create_app(db[1], token)


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_args: object, **_kwargs: object) -> None:
        return None


def call(url: str, token: str | None = None, form: bytes | None = None
         ) -> tuple[int, str, str | None]:
    """(status, body, the cookie set) of a GET (a POST with ``form``), not following
    redirects."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    request = urllib.request.Request(url, data=form, headers=headers)
    try:
        with urllib.request.build_opener(NoRedirect).open(request, timeout=30) as response:
            return response.status, response.read().decode(), response.headers["set-cookie"]
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), exc.headers["set-cookie"]


def test_plus_logs_no_one_in(tmp_path: Path) -> None:
    """A form's ``+`` is a space: with a token that can be one no more, it opens nothing."""
    url = f"sqlite:///{tmp_path}/plus.db"
    Store.open(url).close()
    with serving(url, SHARED) as base:
        assert call(f"{base}/login", form=b"token=+")[0] == 401
        assert call(f"{base}/login", form=b"token=")[0] == 401
        assert call(f"{base}/api/jobs", "+")[0] == 401
        status, _, cookie = call(f"{base}/login", form=f"token={SHARED}".encode())
        assert status == 303 and cookie is not None and SHARED in cookie


def test_the_dashboard_admits_the_stores_users_by_their_tokens(team) -> None:
    from harness.access.tokens import read_token_file

    alice = read_token_file(team.token_file("alice"))
    bob = read_token_file(team.token_file("bob"))
    with serving(team.url) as base:  # loopback, no shared token: the users' tokens still
        assert call(f"{base}/api/jobs")[0] == 401
        assert call(f"{base}/")[0] == 401
        assert call(f"{base}/api/jobs", "bf_" + "q" * 43)[0] == 401
        assert call(f"{base}/login", form=b"token=+")[0] == 401
        status, body, _ = call(f"{base}/api/jobs", bob)
        assert status == 200 and json.loads(body) is not None
        status, _, cookie = call(f"{base}/login", form=f"token={alice}".encode())
        assert status == 303 and cookie is not None
        team.found("alice", "users", "revoke", "bob")
        assert call(f"{base}/api/jobs", bob)[0] == 401  # at once
        assert call(f"{base}/api/jobs", alice)[0] == 200


def test_beyond_loopback_the_users_tokens_are_enough(team) -> None:
    from harness.commands.web import store_has_users

    assert store_has_users(team.url)
    assert not store_has_users(f"sqlite:///{team.folder}/no-store.db")
    listening_socket("0.0.0.0", 0, None, lambda: store_has_users(team.url)).close()
    with pytest.raises(InputError, match="needs a token"):
        listening_socket("0.0.0.0", 0, None, lambda: False)
