"""Revisions are shown as their short sha and commit subject; a history of a thousand revisions
reads the subjects at once (one `git cat-file --batch`), and they must be what `git log`
says."""

from __future__ import annotations

from harness.identity import DIRTY, git_output, revision_labels


def test_labels_read_at_once_are_git_logs_subjects() -> None:
    commits = git_output("rev-list", "--max-count=300", "HEAD").split()
    assert len(commits) > 1  # a clone with history (CI clones the whole repository)
    short = commits[1][:9]
    names = [*commits, f"{commits[0]}{DIRTY}", short, "not-a-commit", "-n", "a\nb", ""]
    labels = revision_labels(names)
    subjects = git_output("log", "--no-walk=unsorted", "--format=%s", *commits).splitlines()
    assert [labels[c] for c in commits] == [f"{c[:7]} {s}" for c, s in
                                            zip(commits, subjects, strict=True)]
    assert labels[f"{commits[0]}{DIRTY}"] == f"{commits[0][:7]}{DIRTY} {subjects[0]}"
    assert labels[short] == f"{short[:7]} {subjects[1]}"
    # names git does not know as commits are shown as they are; none is asked of git as an
    # option or with a line break in it
    assert (labels["not-a-commit"], labels["-n"], labels["a\nb"]) == ("not-a-commit", "-n", "a\nb")
    assert "" not in labels
