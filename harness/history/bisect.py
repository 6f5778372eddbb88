"""`benchfarm bisect`: the first commit between a good and a bad revision where a metric got
worse beyond noise, building and running only the revisions the search needs.

The candidates are the commits after ``good`` up to ``bad`` that change the engine's sources
(``engine/`` for lmc: the others build the same engine). ``good`` and ``bad`` are measured
first (stored runs are reused); they must differ beyond noise. Then a binary search: a
candidate is *bad* when its ratio to ``good`` (geometric mean over the spec's configs of the
medians' ratio) is worse than ``good`` by more than the limit of
``reports.steps.differs_beyond_noise`` (``--threshold``, raised to three times the run-to-run
noise). A candidate that does not build is named and skipped, as `git bisect skip` does: the
search tests a neighbour instead; should only skipped candidates remain, the result names every
commit the first bad one may be.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.errors import InputError, RunFailure
from harness.history.measure import BuildFailed, Measurer
from harness.history.revisions import (
    commit_info,
    engine_commits,
    engine_revision,
    folders,
    is_ancestor,
    resolve,
)
from reports.metrics import HIGHER_IS_BETTER, METRICS
from reports.steps import StepParams, differs_beyond_noise


@dataclass
class BisectResult:
    first_bad: str
    tested: list[str]  # the revisions measured, in the order tested
    skipped: list[str]  # those that did not build
    good_value: float  # the metric at good and bad (median over runs; geometric mean of configs)
    bad_value: float
    possibly: list[str] = field(default_factory=list)  # with skips: every commit it may be
    subject: str = ""  # the first bad commit's subject and author date
    authored: str = ""
    devices: list[str] = field(default_factory=list)  # where it was measured
    good_engine: str = ""  # the revisions measured for --good and --bad
    bad_engine: str = ""

    @property
    def ratio(self) -> float:
        return self.bad_value / self.good_value

    def document(self) -> dict[str, Any]:
        return {"first_bad": self.first_bad, "subject": self.subject,
                "authored": self.authored, "devices": self.devices, "ratio": self.ratio,
                "tested": self.tested, "skipped": self.skipped,
                "possibly_first_bad": self.possibly, "good_value": self.good_value,
                "bad_value": self.bad_value, "good_engine": self.good_engine,
                "bad_engine": self.bad_engine}

    def line(self, metric: str) -> str:
        date = f" {self.authored[:10]}" if self.authored else ""
        return (f"first bad commit: {self.first_bad[:12]}{date} {self.subject!r}: {metric} "
                f"{self.ratio:.3g}x on {', '.join(self.devices)} ({self.good_value:.4g} at "
                f"good {self.good_engine[:12]}, {self.bad_value:.4g} at bad "
                f"{self.bad_engine[:12]}; {len(self.tested)} revisions measured)\n"
                f"  {self.first_bad}")


class BudgetSpent(RunFailure):
    """The search needs another revision measured after its deadline."""


@dataclass
class Judge:
    """Measures revisions and judges each against ``good``."""

    measurer: Measurer
    metric: str
    params: StepParams
    say: Callable[[str], None]
    deadline: float | None = None  # time.monotonic() after which nothing more is measured
    tested: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    reference: dict[str, list[float]] = field(default_factory=dict)

    def values(self, revision: str) -> dict[str, list[float]]:
        """config -> the metric's values at ``revision`` (measured when not stored)."""
        if self.measurer.missing([revision]):
            if self.deadline is not None and time.monotonic() >= self.deadline:
                raise BudgetSpent(f"the budget is spent before {revision[:12]} was measured")
            self.measurer.build(revision)  # BuildFailed names it
            self.say(f"bisect: measuring {revision}")
            self.measurer.run([revision])
        else:
            self.say(f"bisect: {revision} is stored: reused")
        self.tested.append(revision)
        found = {config: [r.values[self.metric] for r in runs if self.metric in r.values]
                 for config, runs in self.measurer.results(revision).items()}
        return {config: values for config, values in found.items() if values}

    def ratio(self, values: dict[str, list[float]]) -> tuple[float, float]:
        common = sorted(set(self.reference) & set(values))
        if not common:
            raise RunFailure(f"no config has {self.metric} at both revisions; is the metric "
                             "one the spec's workloads measure?")
        return differs_beyond_noise([self.reference[c] for c in common],
                                    [values[c] for c in common], self.params)

    def is_bad(self, values: dict[str, list[float]]) -> bool:
        ratio, limit = self.ratio(values)
        if self.metric in HIGHER_IS_BETTER:
            return ratio < 1.0 / (1.0 + limit)
        return ratio > 1.0 + limit


def level(values: dict[str, list[float]]) -> float:
    """One figure for a revision: the geometric mean over configs of the median over runs."""
    medians = [statistics.median(v) for v in values.values()]
    return math.exp(statistics.fmean(math.log(m) for m in medians))


@dataclass(frozen=True)
class Range:
    good: str  # as the user named them
    bad: str
    base: str  # good's engine: the last commit at or before good that changed the sources
    candidates: list[str]  # the commits after good up to bad that change them, oldest first
    good_commit: str = ""  # what good and bad resolve to
    bad_commit: str = ""

    def replacements(self) -> list[str]:
        """What the search measures instead of the names given: a commit that leaves the
        sources alone builds the engine of the last commit that changed them."""
        said = []
        for flag, name, commit, engine in (("--good", self.good, self.good_commit, self.base),
                                           ("--bad", self.bad, self.bad_commit,
                                            self.candidates[-1])):
            if commit and engine != commit:
                said.append(f"{flag} {name} ({commit[:12]}) leaves the engine's sources alone: "
                            f"measured as {engine[:12]}, the last commit before it that "
                            "changed them")
        return said


def bisect_range(good: str, bad: str, paths: list[str]) -> Range:
    """The commits to search, or InputError when good is not an ancestor of bad or no commit
    between them changes the engine's sources ``paths`` (checked before anything is built)."""
    good_commit, bad_commit = resolve(good, paths), resolve(bad, paths)
    if not is_ancestor(good_commit, bad_commit):
        raise InputError(f"--good {good} ({good_commit[:12]}) is not an ancestor of --bad {bad} "
                         f"({bad_commit[:12]})")
    candidates = engine_commits(good_commit, bad_commit, paths)
    if not candidates:
        raise InputError(f"no commit after --good {good} up to --bad {bad} changes "
                         f"{folders(paths)}: they build the same engine")
    return Range(good, bad, engine_revision(good_commit, paths), candidates, good_commit,
                 bad_commit)


def bisect(measurer: Measurer, span: Range, metric: str, threshold: float,
           say: Callable[[str], None], deadline: float | None = None) -> BisectResult:
    """``deadline``: a time.monotonic() after which a revision still to measure raises
    BudgetSpent (`track` bisects within its confirmation budget)."""
    if metric not in METRICS:
        raise InputError(f"unknown metric {metric!r}; allowed: {', '.join(METRICS)}")
    good, bad, candidates = span.good, span.bad, span.candidates
    judge = Judge(measurer, metric, StepParams(threshold=threshold), say, deadline)
    for line in span.replacements():
        say(f"bisect: {line}")
    try:
        judge.reference = judge.values(span.base)
        bad_values = judge.values(candidates[-1])
    except BuildFailed as exc:
        raise InputError(f"{exc}; --good and --bad must build") from None
    if not judge.is_bad(bad_values):
        ratio, limit = judge.ratio(bad_values)
        raise InputError(f"--good {good} and --bad {bad} do not differ beyond noise in {metric} "
                         f"(bad/good {ratio:.3g}, worse only beyond {100 * limit:.1f} %): "
                         "nothing to bisect")

    def test(index: int) -> bool | None:
        try:
            return judge.is_bad(judge.values(candidates[index]))
        except BuildFailed as exc:
            say(f"bisect: {exc}: skipped")
            judge.skipped.append(candidates[index])
            return None

    high, open_range = search(len(candidates), test)
    possibly = [candidates[i] for i in open_range]
    info = commit_info([candidates[high]]).get(candidates[high])
    return BisectResult(candidates[high], judge.tested, judge.skipped, level(judge.reference),
                        level(bad_values), possibly if len(possibly) > 1 else [],
                        info.subject if info else "", info.authored if info else "",
                        list(measurer.placement.devices), span.base, candidates[-1])


def search(count: int, is_bad: Callable[[int], bool | None]) -> tuple[int, list[int]]:
    """Binary search for the first bad of ``count`` candidates, the last of which is bad and
    whose predecessor (index -1) is good; ``is_bad(i)`` is None when candidate ``i`` cannot be
    tested (it does not build): a neighbour nearest the middle is tested instead. Returns the
    first bad index known and every index it may be (more than one when only untestable
    candidates separate the last good from it)."""
    low, high = -1, count - 1
    untestable: set[int] = set()
    while open_ := [i for i in range(low + 1, high) if i not in untestable]:
        middle = (low + high) // 2
        pick = min(open_, key=lambda i: (abs(i - middle), i))
        verdict = is_bad(pick)
        if verdict is None:
            untestable.add(pick)
        elif verdict:
            high = pick
        else:
            low = pick
    return high, list(range(low + 1, high + 1))
