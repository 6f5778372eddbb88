"""`benchfarm track`: run a spec on every new commit of its engine's sources (``engine/`` for
lmc; what a nightly job calls) and report the regressions the history then shows.

The revisions are ``--since`` (its engine: the last commit at or before it that changed the
sources) and every later commit up to HEAD that changes them. Those after the last
one the experiment already holds are new: each is built (one that does not build is named and
left out), then all are run in one matrix (the coordinator interleaves them, so drift on a
board spreads over the revisions). The history of the metric is computed over every stored
revision, and each step at a new revision that makes it worse goes to the ``announce`` hook
(``regression_hook``: its line, and the notification targets).

With ``ends_only`` (a nightly that measures the night's ends) only the newest new commit is
run (and ``--since``'s engine, when nothing is stored yet): a step there spans every commit of
the night, and ``narrow`` bisects it to the first bad one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from harness.errors import InputError, RunFailure
from harness.execution import notify
from harness.history.bisect import BisectResult, BudgetSpent, Range, bisect
from harness.history.measure import BuildFailed, Measurer
from harness.history.revisions import (
    commit_info,
    engine_commits,
    engine_revision,
    folders,
    resolve,
)
from harness.identity import commit_order
from reports.commits import CommitSummary, commit_summaries
from reports.history import BoardStep, History, HistoryStep, first_run_order, history
from reports.steps import StepParams


def regression_hook(targets: notify.Targets) -> Callable[[CommitSummary], None]:
    """What `benchfarm track` does with each commit where the metric got worse: print its
    summary and per-config lines, and send each step to the notification targets
    (``--notify``, the spec's ``[notify]``) as a ``regression`` event with the experiment,
    commit, subject, previous revision, metric, device, config, levels and ratio."""
    def announce(summary: CommitSummary) -> None:
        print(summary.line(), file=sys.stdout, flush=True)
        for step in summary.steps:
            print(f"  {step.line()}", file=sys.stdout, flush=True)
            if targets:
                notify.announce({"event": "regression", "line": step.line(),
                                 "experiment": summary.experiment, "subject": summary.subject,
                                 "previous": summary.previous, **asdict(step)}, targets)
    return announce


@dataclass
class TrackResult:
    new: list[str]  # the revisions run now
    skipped: list[str]  # those that did not build
    history: History
    regressions: list[HistoryStep] = field(default_factory=list)
    summaries: list[CommitSummary] = field(default_factory=list)  # of the new revisions
    # regressions at new revisions whose engine code is the revision before's: the boards'
    board_steps: list[BoardStep] = field(default_factory=list)


def revisions_since(since: str, paths: list[str]) -> list[str]:
    """``since``'s engine and every later commit up to HEAD that changes ``paths``."""
    base = resolve(since, paths)
    return [engine_revision(base, paths), *engine_commits(base, "HEAD", paths)]


def track(measurer: Measurer, since: str, metric: str, threshold: float,
          say: Callable[[str], None],
          announce: Callable[[CommitSummary], None], ends_only: bool = False) -> TrackResult:
    """``threshold``: the smallest relative step reported (reports.steps.StepParams)."""
    revisions = revisions_since(since, measurer.paths)
    stored = {r.revision for r in measurer.stored()}
    last = max((i for i, rev in enumerate(revisions) if rev in stored), default=-1)
    pending = revisions[last + 1:]
    if ends_only:
        pending = list(dict.fromkeys((pending[:1] if last < 0 else []) + pending[-1:]))
    new, skipped = [], []
    for revision in pending:
        try:
            measurer.build(revision)
        except BuildFailed as exc:
            say(f"track: {exc}: skipped")
            skipped.append(revision)
            continue
        new.append(revision)
    if new:
        say(f"track: running {len(new)} new revision(s) since {revisions[max(last, 0)][:12]}")
        measurer.run(new)
    else:
        say(f"track: no new commit of {folders(measurer.paths)} since "
            f"{revisions[max(last, 0)][:12]}")
    runs = measurer.stored()
    if not runs:
        raise InputError(f"experiment {measurer.spec.name!r} holds no ok runs to show")
    hist = history(runs, commit_order(first_run_order(runs)), metric,
                   devices=list(measurer.placement.devices),
                   params=StepParams(threshold=threshold), cache=measurer.store)
    result = TrackResult(new, skipped, hist, board_steps=sorted(
        (b for b in hist.board_steps if b.step.revision in new and b.step.regression),
        key=lambda b: (b.step.device, b.step.revision)))
    for summary in commit_summaries(hist, commit_info(hist.revisions)):
        if summary.revision in new:
            result.summaries.append(summary)
        worse = [s for s in summary.steps if s.regression]
        if worse and summary.revision in new:
            result.regressions += worse
            announce(replace(summary, steps=worse))
    return result


def narrow(measurer: Measurer, summary: CommitSummary, metric: str, threshold: float,
           deadline: float, say: Callable[[str], None]
           ) -> tuple[CommitSummary, BisectResult | None]:
    """A confirmed step whose revision and the one measured before it are several engine
    commits apart, bisected (``harness.history.bisect``) until ``deadline`` (time.monotonic())
    to its first bad commit: the summary with that commit, its subject and the commit before
    it, and the search's result (None when the step spans one commit). A search the deadline
    stops, or one bisect's own measure of the ends does not see, is left at its revision."""
    assert summary.previous is not None, "a step has a revision before it"
    candidates = engine_commits(summary.previous, summary.revision, measurer.paths)
    if len(candidates) < 2:
        return summary, None
    say(f"track: the step at {summary.revision[:12]} spans {len(candidates)} commits of "
        f"{folders(measurer.paths)}: bisecting")
    span = Range(summary.previous, summary.revision, summary.previous, candidates)
    try:
        found = bisect(measurer, span, metric, threshold, say, deadline)
    except BudgetSpent as exc:
        say(f"track: {exc}: the first bad commit is one of {len(candidates)}: "
            + ", ".join(c[:12] for c in candidates))
        return summary, None
    except (InputError, RunFailure) as exc:  # the ends do not differ by bisect's measure
        say(f"track: the step at {summary.revision[:12]} is not bisected: {exc}")
        return summary, None
    index = candidates.index(found.first_bad)
    before = candidates[index - 1] if index else summary.previous
    steps = [replace(step, revision=found.first_bad) for step in summary.steps]
    return replace(summary, revision=found.first_bad, previous=before, subject=found.subject,
                   authored=found.authored, steps=steps), found
