"""A commit without the engine's sources (one that deleted engine/) is one that does not build:
bisect and track skip it instead of stopping. A small git repository of its own (engine/ made,
deleted, made again), the real spec, inventory and SQLite store, in a process of its own (the
repository root is read when the harness is imported)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fixtures_ray import needle_spec

from harness import REPO_ROOT

CHECK = """
import sys
from pathlib import Path
from db.store import Store
from devices.inventory import load_inventory
from harness.history.bisect import bisect_range
from harness.history.measure import BuildFailed, Measurer
from harness.spec import load_spec

spec_path, inventory_path, url, before, without, after = sys.argv[1:]
spec = load_spec(spec_path)
with Store.open(url) as store, Measurer(spec, load_inventory(inventory_path), store,
                                        "local") as measurer:
    print("range", " ".join(bisect_range(before, after, measurer.paths).candidates))
    print("missing", " ".join(measurer.missing([before])))
    try:
        measurer.missing([without])
        print("measured", without)
    except BuildFailed as exc:
        print("does not build:", exc)
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_a_commit_without_the_engine_is_skipped_as_one_that_does_not_build(
        tmp_path: Path, needle_model: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "engine").mkdir(parents=True)
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "test@example.com")
    git(repo, "config", "user.name", "test")
    (repo / "engine" / "main.c").write_text("int main(void) { return 0; }\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "engine")
    before = git(repo, "rev-parse", "HEAD")
    git(repo, "rm", "-rq", "engine")
    git(repo, "commit", "-qm", "no engine")
    without = git(repo, "rev-parse", "HEAD")
    (repo / "engine").mkdir()
    (repo / "engine" / "main.c").write_text("int main(void) { return 1; }\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "engine again")
    after = git(repo, "rev-parse", "HEAD")
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(f'[[device]]\nname = "local"\nworkdir = "{tmp_path}/work"\n')
    spec = needle_spec(tmp_path, "sources", needle_model, ["local"])
    done = subprocess.run(
        [sys.executable, "-c", CHECK, str(spec), str(inventory),
         f"sqlite:///{tmp_path}/history.db", before, without, after],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "BENCHFARM_REPO_ROOT": str(repo)})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"range {without} {after}"  # the commit is one bisect tries
    assert lines[1] == f"missing {before}"  # a revision with the sources is planned as usual
    assert lines[2].startswith(f"does not build: revision {without} does not build: it has "
                               "no engine/"), done.stdout
