"""Engine revisions in git: names resolved to commits, commits in commit order, the commits
between two that change an engine's sources.

A revision as the store names it is a commit (40 hex digits), or ``<commit>+dirty`` for a
working tree whose engine sources had local changes (``harness.identity.worktree_revision``).
The sources are the folders of this repository a spec's engines are built from
(``harness.engines.source_paths``: ``engine/`` for lmc); a commit that changes none of them
builds the same engines as its parent.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from harness import REPO_ROOT
from harness.errors import InputError
from harness.identity import WORKTREE, git_output, worktree_revision
from reports.commits import CommitInfo


def folders(paths: Sequence[str]) -> str:
    """Source folders as messages name them: ``engine/``."""
    return ", ".join(f"{path}/" for path in paths)


def resolve(name: str, paths: Sequence[str]) -> str:
    """The commit a git revision name (branch, tag, sha or its prefix, HEAD~2) names; the
    working tree's revision for ``worktree`` (dirty when ``paths`` have local changes)."""
    if name == WORKTREE:
        return worktree_revision(paths)
    try:
        return git_output("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}")
    except InputError:
        raise InputError(f"{name!r} is not a git revision of {REPO_ROOT} (a branch, tag, "
                         f"commit, HEAD~N, or {WORKTREE!r})") from None


def try_resolve(name: str, paths: Sequence[str]) -> str | None:
    """``resolve``, or None when ``name`` names no revision."""
    try:
        return resolve(name, paths)
    except InputError:
        return None


def engine_revision(commit: str, paths: Sequence[str]) -> str:
    """The last commit at or before ``commit`` that changed ``paths``: the name of the engine
    ``commit`` builds (commits that leave the sources alone build the same one)."""
    last = git_output("rev-list", "-1", commit, "--", *paths)
    return last or commit


def is_ancestor(older: str, newer: str) -> bool:
    done = subprocess.run(["git", "merge-base", "--is-ancestor", older, newer], cwd=REPO_ROOT,
                          capture_output=True)
    return done.returncode == 0


def engine_commits(since: str, until: str, paths: Sequence[str]) -> list[str]:
    """The commits after ``since`` up to ``until`` that change ``paths``, oldest first."""
    out = git_output("rev-list", "--reverse", "--topo-order", f"{since}..{until}", "--", *paths)
    return out.split()


def commit_info(revisions: Sequence[str]) -> dict[str, CommitInfo]:
    """revision -> its subject and author date, for those git knows (one `git log` for all;
    a working tree with local changes is described by its commit)."""
    commits = {r: r.partition("+")[0] for r in revisions}
    known = [c for c in dict.fromkeys(commits.values()) if len(c) == 40 and "\n" not in c]
    if not known:
        return {}
    done = subprocess.run(["git", "log", "--no-walk=unsorted", "--format=%H%x00%aI%x00%s",
                           *known], cwd=REPO_ROOT, capture_output=True, text=True)
    found = {}
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        sha, _, rest = line.partition("\0")
        authored, _, subject = rest.partition("\0")
        found[sha] = (subject, authored)
    return {revision: CommitInfo(revision, *found[commit])
            for revision, commit in commits.items() if commit in found}
