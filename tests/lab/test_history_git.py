"""History, track and bisect on real git revisions: a scratch clone of this repository with a
series of small engine commits, one of which makes the perplexity 10x worse (a wrong term in
its negative log-likelihood), one that does not compile and one outside engine/. Real builds,
real runs through the coordinator (the CLI, with a Ray instance of its own), a real SQLite
store. The metric followed is the perplexity, which the engine computes the same, to the last
bit, on every run of the same code (one thread): what is found cannot depend on the machine's
load, as a timing's step would."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import REPO_ROOT

# The decode spec, a commit that slows each decode step by a busy loop of 600,000 additions
# (SLOW, many times the tiny model's step) and the threshold that step is judged at: for the
# modules that follow a timing step across revisions (test_history_names, test_board_blame,
# test_roofline); this module follows the perplexity.
SLOW = """        { volatile double sink = 0.0; for (long i = 0; i < 600000; i++) sink += 1e-9; }
"""
SPEC_HEAD = """name = "hist"
model = "{model}"
devices = ["local"]
repeats = 3
warmups = 1

[engine]
threads = 1

[engine.policy.exact]

[[workload]]
"""
SPEC = SPEC_HEAD + """kind = "decode"
ctx = 64
max_new = 16
"""

NLL_LINE = "    nll /= scored;\n"
WORSE = NLL_LINE + "    nll += 2.302585092994046; /* ln 10: the perplexity 10x worse */\n"
PPL_SPEC = SPEC_HEAD + """kind = "ppl"
length = 64
seed = 0
text = "{text}"
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def commit(repo: Path, message: str, path: str, edit, tag: str | None = None) -> str:
    """Commit ``edit`` of ``path`` (tagged ``tag`` if given); returns the commit."""
    file = repo / path
    file.write_text(edit(file.read_text()))
    git(repo, "commit", "-qam", message)
    if tag:
        git(repo, "tag", tag)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("history-git")
    repo = root / "repo"
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(repo)], check=True)
    git(repo, "config", "user.email", "test@example.com")
    git(repo, "config", "user.name", "test")
    good = git(repo, "rev-list", "-1", "HEAD", "--", "engine")
    commits = [
        commit(repo, "harmless 1", "engine/util.c", lambda t: t + "/* harmless 1 */\n"),
        commit(repo, "worse perplexity", "engine/cmd_ppl.c",
               lambda t: t.replace(NLL_LINE, WORSE)),
        commit(repo, "harmless 2", "engine/ops.c", lambda t: t + "/* harmless 2 */\n"),
        commit(repo, "harmless 3", "engine/json.c", lambda t: t + "/* harmless 3 */\n"),
    ]
    broken = commit(repo, "broken", "engine/json.c", lambda t: t + "this does not compile\n")
    commit(repo, "docs only", "README.md", lambda t: t + "\n")
    spec = root / "spec.toml"
    model = REPO_ROOT / "models" / "pydoc-lm"
    spec.write_text(PPL_SPEC.format(model=model, text=model / "heldout.txt"))
    return {"root": root, "repo": repo, "good": good, "commits": commits, "broken": broken,
            "spec": spec}


def cli(scratch: dict, db: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "BENCHFARM_INVENTORY"}
    env |= {"BENCHFARM_REPO_ROOT": str(scratch["repo"]),
            "BENCHFARM_BUILD_DIR": str(scratch["root"] / "build"),
            "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "harness.cli", "--db",
                           f"sqlite:///{scratch['root'] / db}", *args],
                          # not in the clone: `python -m` would import the clone's harness
                          cwd=scratch["root"], env=env, capture_output=True, text=True,
                          timeout=1200)


# The perplexity, followed with a threshold of its own: a step must be beyond 4x (the worse
# commit's is 10x, and every other revision's perplexity is the good one's exactly).
THRESHOLD = ["--threshold", "3"]
PPL_THRESHOLD = ["--metric", "ppl", "--threshold", "3"]


def test_track_history_and_bisect_find_the_worse_commit(scratch: dict) -> None:
    good, commits = scratch["good"], scratch["commits"]
    worse = commits[1]
    events = scratch["spec"].parent / "events.jsonl"
    tracked = cli(scratch, "track.db", "track", str(scratch["spec"]), "--since", good,
                  *PPL_THRESHOLD, "--notify", f"cat >> {events}; echo >> {events}")
    assert tracked.returncode == 0, tracked.stderr[-3000:]
    # the regression is one line naming the commit, metric, device and ratio; the broken
    # commit is named and left out
    lines = [line.strip() for line in tracked.stdout.splitlines()
             if line.strip().startswith("regression:")]
    assert len(lines) == 1 and f"commit {worse[:12]} ppl on local:" in lines[0]
    assert f"revision {scratch['broken']} does not build" in tracked.stderr
    # and the notification hook got it as a regression event
    sent = [json.loads(line) for line in events.read_text().splitlines() if line]
    (event,) = [e for e in sent if e["event"] == "regression"]
    assert (event["event"], event["revision"], event["metric"], event["device"]) == (
        "regression", worse, "ppl", "local")
    assert math.isclose(event["ratio"], 10.0, rel_tol=1e-6)

    shown = cli(scratch, "track.db", "history", "hist", "--json", *PPL_THRESHOLD)
    assert shown.returncode == 0, shown.stderr[-3000:]
    document = json.loads(shown.stdout)
    (series,) = document["series"]
    assert [p["revision"] for p in series["points"]] == [good, *commits]
    assert all(p["n"] == 3 for p in series["points"])
    assert [s["revision"] for s in document["steps"]] == [worse]  # that commit and no other
    assert math.isclose(document["steps"][0]["ratio"], 10.0, rel_tol=1e-6)
    assert document["steps"][0]["device"] == "local"
    # every revision's runs agree to the last bit: the metric depends on the code alone
    assert all(len(set(p["values"])) == 1 for p in series["points"])

    # a fresh store: bisect measures only what the search needs
    found = cli(scratch, "bisect.db", "bisect", str(scratch["spec"]), "--good", good,
                "--bad", commits[-1], "--json", *PPL_THRESHOLD)
    assert found.returncode == 0, found.stderr[-3000:]
    result = json.loads(found.stdout)
    assert result["first_bad"] == worse
    n = len(commits) + 1  # the revisions from good to bad
    assert len(result["tested"]) <= math.ceil(math.log2(n)) + 1
    assert math.isclose(result["bad_value"], 10.0 * result["good_value"], rel_tol=1e-6)
    stored = cli(scratch, "bisect.db", "history", "hist", "--json", "--metric", "ppl")
    assert {p["revision"] for p in json.loads(stored.stdout)["series"][0]["points"]} == \
        set(result["tested"])  # the store holds runs of the revisions it tested, no others

    # refusals: good after bad; a bad that does not build; good and bad on the same level
    # (stored: nothing runs)
    backwards = cli(scratch, "bisect.db", "bisect", str(scratch["spec"]), "--good",
                    commits[-1], "--bad", good)
    assert backwards.returncode == 2 and "is not an ancestor of --bad" in backwards.stderr
    broken = cli(scratch, "bisect.db", "bisect", str(scratch["spec"]), "--good", good,
                 "--bad", scratch["broken"])
    assert broken.returncode == 2 and f"revision {scratch['broken']} does not build" in \
        broken.stderr
    level = cli(scratch, "bisect.db", "bisect", str(scratch["spec"]), "--good", worse,
                "--bad", commits[-1], *PPL_THRESHOLD)
    assert level.returncode == 2 and "do not differ beyond noise" in level.stderr
