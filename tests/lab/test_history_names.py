"""Every git name of a revision finds its runs, and the history speaks per commit. A scratch
clone of this repository with a comment-only engine commit (tagged ``v-good``), a harmless code
change and its revert (the revert has v-good's sources, hence its binary: the store keeps one
build row for both), a commit that slows decoding (``SLOW``), a commit outside engine/, and
another comment-only engine commit. Real builds, real runs through the CLI, one real SQLite
store shared by track, history, bisect and compare."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

import pytest
from fixtures_web import serving
from test_history_git import SLOW, SPEC, THRESHOLD, cli, commit, git

from harness import REPO_ROOT

# A step of 2x: how much -O0 slows the tiny model's decode depends on the host (2.8x on a Xeon
# with AVX-512, 7x on a Zen 5); THRESHOLD's 4x is for the planted busy loop of SLOW.
O0_THRESHOLD = ["--threshold", "1"]

STEP_LINE = "        ms[n_out] = lmc_now_ms() - t1;\n"


def fetch(url: str, form: dict[str, str] | None = None,
          token: str | None = None) -> tuple[int, str]:
    """GET (or with ``form``, POST) ``url``: its status and body."""
    data = None if form is None else urllib.parse.urlencode(form).encode()
    request = urllib.request.Request(url, data=data, headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture(scope="module")
def named(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("history-names")
    repo = root / "repo"
    git(root, "clone", "-q", str(REPO_ROOT), str(repo))
    git(repo, "config", "user.email", "test@example.com")
    git(repo, "config", "user.name", "test")
    since = git(repo, "rev-parse", "HEAD")
    comment = commit(repo, "a comment", "engine/util.c", lambda t: t + "/* a comment */\n",
                     tag="v-good")
    harmless = commit(repo, "a harmless function", "engine/util.c",
                      lambda t: t + "int lmc_harmless(void) { return 1; }\n")
    git(repo, "revert", "--no-edit", harmless)
    revert = git(repo, "rev-parse", "HEAD")
    slow = commit(repo, "slow decode", "engine/cmd_generate.c",
                  lambda t: t.replace(STEP_LINE, SLOW + STEP_LINE), tag="SLOW")
    docs = commit(repo, "docs only", "README.md", lambda t: t + "\n")
    later = commit(repo, "another comment", "engine/ops.c", lambda t: t + "/* later */\n")
    spec = root / "spec.toml"
    # the spec asks `track` to confirm each step (the first test's --confirm-budget 0 says not)
    spec.write_text(SPEC.format(model=REPO_ROOT / "models" / "needle-tiny")
                    + "\n[track]\nconfirm_budget_s = 600\n")
    return {"root": root, "repo": repo, "spec": spec, "since": since, "comment": comment,
            "harmless": harmless, "revert": revert, "slow": slow, "docs": docs, "later": later}


def test_revisions_sharing_a_binary_resolve_to_its_runs_in_history_bisect_and_compare(
        named: dict) -> None:
    events = named["root"] / "events.jsonl"
    tracked = cli(named, "names.db", "track", str(named["spec"]), "--since", named["since"],
                  *THRESHOLD, "--notify", f"cat >> {events}; echo >> {events}",
                  "--confirm-budget", "0")
    assert tracked.returncode == 0, tracked.stderr[-3000:]
    assert "confirmation of" not in tracked.stdout  # the flag overrides the spec's budget
    # per commit first: short sha, date, subject, configs moved of those measured, devices
    summary = [line for line in tracked.stdout.splitlines()
               if line.startswith("regression at commit")]
    assert len(summary) == 1, tracked.stdout + tracked.stderr[-2000:]
    assert summary[0].startswith(f"regression at commit {named['slow'][:12]} ")
    assert "'slow decode': 1 of 1 configs moved" in summary[0] and "on local" in summary[0]
    sent = [json.loads(line) for line in events.read_text().splitlines() if line]
    (event,) = [e for e in sent if e["event"] == "regression"]
    assert (event["experiment"], event["revision"], event["previous"], event["subject"]) == (
        "hist", named["slow"], named["revert"], "slow decode")

    shown = cli(named, "names.db", "history", "hist", "--json", *THRESHOLD)
    assert shown.returncode == 0, shown.stderr[-3000:]
    document = json.loads(shown.stdout)
    (series,) = document["series"]
    points = {p["revision"]: p for p in series["points"]}
    # the revert builds v-good's binary: it is shown at its own place with that binary's runs
    assert list(points) == [git(named["repo"], "rev-list", "-1", named["since"], "--", "engine"),
                            named["comment"], named["harmless"], named["revert"],
                            named["slow"], named["later"]]
    assert points[named["revert"]]["values"] == points[named["comment"]]["values"]
    assert points[named["revert"]]["values"] != points[named["harmless"]]["values"]
    # one step, at the slow commit: none at a commit that changes comments only
    assert [s["revision"] for s in document["steps"]] == [named["slow"]]
    assert [(c["revision"], c["previous"], c["subject"], c["moved"], c["measured"],
             c["devices"]) for c in document["commits"]] == [
        (named["slow"], named["revert"], "slow decode", 1, 1, ["local"])]
    assert document["commits"][0]["ratio"] > 4

    # bisect on the same store: tags and a commit outside engine/ (said to be replaced)
    found = cli(named, "names.db", "bisect", str(named["spec"]), "--good", "v-good", "--bad",
                "HEAD~1", "--json", *THRESHOLD)
    assert found.returncode == 0, found.stderr[-3000:]
    result = json.loads(found.stdout)
    assert (result["first_bad"], result["subject"], result["devices"]) == (
        named["slow"], "slow decode", ["local"])
    assert result["ratio"] > 4 and result["bad_engine"] == named["slow"]
    assert f"--bad HEAD~1 ({named['docs'][:12]}) leaves the engine's sources alone: " \
           f"measured as {named['slow'][:12]}" in found.stderr
    assert "bisect: measuring" not in found.stderr  # both ends were stored: nothing ran

    # compare resolves the same git names, the revert too (its binary is stored under
    # whichever name registered it)
    for a, b in (("v-good", "SLOW"), ("HEAD~3", "HEAD~1")):
        compared = cli(named, "names.db", "compare", a, b, "--experiment", "hist")
        assert compared.returncode == 0, compared.stderr[-3000:]
        assert f"A {a} (" in compared.stdout and f"B {b} (" in compared.stdout


def test_track_opens_one_alert_per_culprit_commit_and_a_revert_suggests_its_fix(
        named: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    night = named["root"] / "night"  # a clone of the scratch history, to add a night to
    git(named["root"], "clone", "-q", str(named["repo"]), str(night))
    git(night, "config", "user.email", "test@example.com")
    git(night, "config", "user.name", "test")
    scratch = named | {"repo": night}
    events = named["root"] / "alert-events.jsonl"
    notify = ["--notify", f"cat >> {events}; echo >> {events}"]

    tracked = cli(scratch, "alerts.db", "track", str(named["spec"]), "--since",
                  named["since"], *THRESHOLD, *notify)  # the spec's [track] budget
    assert tracked.returncode == 0, tracked.stderr[-3000:]
    # confirmed before blamed: the culprit and the revision before it measured again
    confirmation = f"confirmation of {named['slow'][:12]} against {named['revert'][:12]}: "
    assert confirmation + "different" in tracked.stdout
    assert "alert 1 opened: " + named["slow"][:12] + " 'slow decode'" in tracked.stdout
    listed = json.loads(cli(scratch, "alerts.db", "alerts", "list", "--json").stdout)
    assert [(a["id"], a["state"], a["revision"], a["previous"], a["subject"], a["devices"])
            for a in listed] == [(1, "untriaged", named["slow"], named["revert"],
                                  "slow decode", ["local"])]
    (step,) = listed[0]["steps"]
    assert step["regression"] and step["ratio"] > 4 and step["metric"] == "decode_ms_per_token"
    assert listed[0]["changes"][0]["note"].startswith(confirmation + "different")

    # triage as the store's users: the caller's identity, with a note
    monkeypatch.setenv("BENCHFARM_TOKEN_FILE", str(named["root"] / "ann.token"))
    added = cli(scratch, "alerts.db", "users", "add", "ann", "--admin", "--save")
    assert added.returncode == 0, added.stderr
    monkeypatch.setenv("BENCHFARM_TOKEN_FILE", str(named["root"] / "nobody.token"))
    refused = cli(scratch, "alerts.db", "alerts", "ack", "1")
    assert refused.returncode == 2 and "needs your token" in refused.stderr
    monkeypatch.setenv("BENCHFARM_TOKEN_FILE", str(named["root"] / "ann.token"))
    acked = cli(scratch, "alerts.db", "alerts", "ack", "1", "--note", "looking", *notify)
    assert acked.returncode == 0, acked.stderr
    shown = json.loads(cli(scratch, "alerts.db", "alerts", "show", "1", "--json").stdout)
    assert shown["state"] == "acknowledged"
    assert [(c["actor"], c["checked"], c["state_from"], c["state_to"], c["note"])
            for c in shown["changes"]][-1] == ("ann", True, "untriaged", "acknowledged",
                                               "looking")
    bad = cli(scratch, "alerts.db", "alerts", "ack", "7")
    assert bad.returncode == 2 and "no alert 7" in bad.stderr

    # the dashboard: its alerts page and triage need a user's token (the store has users)
    token = (named["root"] / "ann.token").read_text().strip()
    url = f"sqlite:///{named['root'] / 'alerts.db'}"
    with serving(url) as base:
        assert fetch(f"{base}/alerts")[0] == 401
        assert fetch(f"{base}/alerts/1/state", {"state": "invalid"})[0] == 401
        status, page = fetch(f"{base}/alerts/1", token=token)
        assert status == 200 and "slow decode" in page and "<svg" in page
        status, body = fetch(f"{base}/alerts/1/state", {"state": "invalid", "note": "web"},
                             token)
        assert status == 200 and json.loads(body)["state"] == "invalid"
        assert fetch(f"{base}/alerts/1/state", {"state": "bogus"}, token)[0] == 400
        assert fetch(f"{base}/alerts/1/state", {"state": "acknowledged"}, token)[0] == 200
    shown = json.loads(cli(scratch, "alerts.db", "alerts", "show", "1", "--json").stdout)
    assert [(c["actor"], c["checked"], c["state_to"], c["note"])
            for c in shown["changes"]][-2:] == [("ann", True, "invalid", "web"),
                                                ("ann", True, "acknowledged", None)]

    # the next night reverts the slow commit: the alert's series is back, a fix is suggested
    git(night, "revert", "--no-edit", named["slow"])
    fixed_at = git(night, "rev-parse", "HEAD")
    again = cli(scratch, "alerts.db", "track", str(named["spec"]), "--since", named["since"],
                *THRESHOLD, *notify)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "alert 1 fix-suggested" in again.stdout and "opened" not in again.stdout
    shown = json.loads(cli(scratch, "alerts.db", "alerts", "show", "1", "--json").stdout)
    assert shown["state"] == "fix-suggested" and shown["steps"][0]["back_at"] == fixed_at
    # recording the whole history again opens nothing new
    recorded = cli(scratch, "alerts.db", "history", "hist", "--record", *THRESHOLD)
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    assert len(json.loads(cli(scratch, "alerts.db", "alerts", "list", "--json").stdout)) == 1

    sent = [json.loads(line) for line in events.read_text().splitlines() if line]
    assert [(e["event"], e["state"]) for e in sent if e["event"].startswith("alert")] == [
        ("alert-opened", "untriaged"), ("alert-state", "acknowledged"),
        ("alert-state", "fix-suggested")]
    assert sent[-1]["state_from"] == "acknowledged" and sent[-1]["subject"] == "slow decode"


CONFIRM = """
import sys
import time
from db.store import Store
from devices.inventory import load_inventory
from harness.history.confirm import confirm
from harness.history.measure import Measurer
from harness.spec import load_spec
from reports.commits import CommitSummary
from reports.history import HistoryStep

spec_path, url, before, after = sys.argv[1:]
with Store.open(url) as store, Measurer(load_spec(spec_path), load_inventory(None), store,
                                        "local") as measurer:
    for revision in (before, after):
        measurer.build(revision)
    measurer.run([before, after])
    config = next(iter(measurer.results(before)))
    # a step someone claims between two commits that change nothing of the decode
    claimed = CommitSummary("hist", after, before, "claimed", "", 1, [HistoryStep(
        after, "local", config, "decode_ms_per_token", 1.0, 5.0, 5.0)])
    found = confirm(measurer, claimed, "decode_ms_per_token", 3.0, time.monotonic() + 600,
                    print)
    print("verdict", found.verdict, found.rounds)
"""


def test_confirmation_finds_a_claimed_step_between_harmless_commits_the_same(
        named: dict) -> None:
    """Pinpoint's rule on real runs: a step claimed between the comment-only commit and the
    harmless function (the same decode) is measured in more rounds until it is `same`."""
    env = {k: v for k, v in os.environ.items() if k != "BENCHFARM_INVENTORY"}
    env |= {"BENCHFARM_REPO_ROOT": str(named["repo"]),
            "BENCHFARM_BUILD_DIR": str(named["root"] / "build"), "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", CONFIRM, str(named["spec"]),
         f"sqlite:///{named['root'] / 'confirm.db'}", named["comment"], named["harmless"]],
        cwd=named["root"], env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    verdict = done.stdout.strip().splitlines()[-1].split()
    assert verdict[:2] == ["verdict", "same"] and int(verdict[2]) >= 1, done.stdout[-2000:]


def test_a_night_measured_at_its_ends_is_bisected_to_its_first_bad_commit(
        named: dict) -> None:
    """A night of four engine commits on the fast revert: a harmless function, one that
    compiles the matrix kernels at -O0 (decode 2.8x slower on the tiny model on a Xeon with
    AVX-512, about 7x on a Zen 5, measured: so a step of 2x is asked for, O0_THRESHOLD),
    another harmless function, then a comment-only commit. `track` with the spec's
    `ends_only` measures the night's ends, confirms the step and bisects it: the one alert
    names the -O0 commit with its subject, not the night's last."""
    night = named["root"] / "ends"
    git(named["root"], "clone", "-q", str(named["repo"]), str(night))
    git(night, "config", "user.email", "test@example.com")
    git(night, "config", "user.name", "test")
    git(night, "checkout", "-q", "-b", "night", named["revert"])
    harmless = commit(night, "a harmless function", "engine/util.c",
                      lambda t: t + "int lmc_harmless(void) { return 1; }\n")
    slow = commit(night, "matmul at -O0", "engine/matmul.c",
                  lambda t: '#pragma GCC optimize ("O0")\n' + t)
    commit(night, "another harmless function", "engine/util.c",
           lambda t: t + "int lmc_harmless_too(void) { return 2; }\n")
    last = commit(night, "a comment at dawn", "engine/ops.c", lambda t: t + "/* dawn */\n")
    scratch = named | {"repo": night}
    spec = named["root"] / "ends-spec.toml"  # its [track] section is the file's last
    spec.write_text(named["spec"].read_text() + "ends_only = true\n")
    tracked = cli(scratch, "ends.db", "track", str(spec), "--since", named["revert"],
                  *O0_THRESHOLD)  # the spec's [track] budget and ends_only
    assert tracked.returncode == 0, tracked.stderr[-3000:]
    assert f"confirmation of {last[:12]} against {named['revert'][:12]}: different" \
        in tracked.stdout, tracked.stdout + tracked.stderr[-3000:]
    listed = json.loads(cli(scratch, "ends.db", "alerts", "list", "--json").stdout)
    assert [(a["revision"], a["previous"], a["subject"]) for a in listed] == [
        (slow, harmless, "matmul at -O0")], tracked.stdout + tracked.stderr[-3000:]
    assert "bisected: first bad commit: " + slow[:12] in listed[0]["changes"][0]["note"]
    # the ends and the commits the search needed were measured, not the whole night
    shown = json.loads(cli(scratch, "ends.db", "history", "hist", "--json",
                           *O0_THRESHOLD).stdout)
    measured = [p["revision"] for p in shown["series"][0]["points"]]
    assert measured[0] == named["revert"] and measured[-1] == last and slow in measured


PAIR = """
[[device]]
name = "pair-{0}"
transport = "local"
class = "pair"
workdir = "{1}/pair-{0}"
"""


def test_a_step_is_reproduced_on_a_second_board_of_its_class_before_blame(
        named: dict) -> None:
    """An inventory with two boards of one class on this machine: a step confirmed on the
    first is run and confirmed again on the second before its alert opens."""
    inventory = named["root"] / "pair.toml"
    inventory.write_text("".join(PAIR.format(name, named["root"]) for name in "ab"))
    spec = named["root"] / "pair-spec.toml"
    spec.write_text(named["spec"].read_text().replace('devices = ["local"]',
                                                      'devices = ["pair-a"]'))
    tracked = cli(named, "pair.db", "track", str(spec), "--since", named["revert"],
                  "--inventory", str(inventory), *THRESHOLD, "--confirm-budget", "900")
    assert tracked.returncode == 0, tracked.stderr[-3000:]
    again = (f"on pair-b: confirmation of {named['slow'][:12]} against "
             f"{named['revert'][:12]}: different")
    assert again in tracked.stdout, tracked.stdout + tracked.stderr[-3000:]
    listed = json.loads(cli(named, "pair.db", "alerts", "list", "--json").stdout)
    assert [(a["revision"], a["devices"]) for a in listed] == [(named["slow"], ["pair-a"])]
    assert "; reproduced on pair-b: " + again.removeprefix("on pair-b: ") \
        in listed[0]["changes"][0]["note"]
