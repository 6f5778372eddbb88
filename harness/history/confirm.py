"""Confirmation before blame (Chromium Pinpoint's rule): a step `track` found at a commit is
measured again, the culprit and the revision before it in alternating rounds (each round one
more repeat of every config at both, interleaved by the coordinator), until the comparison of
the configs that moved says ``different`` or ``same``; ``unknown`` buys another round, within a
budget of device time. Only a ``different`` step blames the commit (opens an alert).

Per config the two samples are compared with ``reports.stats.compare_samples`` (Mann-Whitney U
and the threshold): ``different`` when the culprit is worse, significantly and beyond the
threshold; ``same`` when it is not worse, significantly (a difference within the threshold) or
after ``SAME_AFTER`` runs a side without significance; ``unknown`` otherwise. The step is
``different`` when one moved config is, ``same`` when all are.

Whether the step is the board's rather than the commit's (its conditions, a second board of
its class) is ``harness.history.boards``'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.history.measure import Measurer
from reports.commits import CommitSummary
from reports.history import worse
from reports.stats import compare_samples, runs_needed

SAME_AFTER = 2 * runs_needed()  # runs a side after which "not significantly worse" is same
MAX_ROUNDS = 12


@dataclass
class Confirmation:
    revision: str
    previous: str
    verdict: str  # different | same | unknown
    rounds: int  # rounds measured beyond what the history held
    seconds: float  # the time they took
    configs: dict[str, str] = field(default_factory=dict)  # config -> its own verdict

    def line(self) -> str:
        return (f"confirmation of {self.revision[:12]} against {self.previous[:12]}: "
                f"{self.verdict} after {self.rounds} more round(s), {self.seconds:.0f} s ("
                + "; ".join(f"{c}: {v}" for c, v in sorted(self.configs.items())) + ")")


def verdict_of(before: list[float], after: list[float], metric: str, threshold: float) -> str:
    change = compare_samples(before, after, threshold)
    if change.verdict in ("slower", "faster"):
        return "different" if worse(metric, change.ratio) else "same"
    if change.verdict == "unchanged" and (
            (change.p_value is not None and change.p_value < 0.05)
            or min(len(before), len(after)) >= SAME_AFTER):
        return "same"
    return "unknown"


def confirm(measurer: Measurer, summary: CommitSummary, metric: str, threshold: float,
            deadline: float, say: Callable[[str], None]) -> Confirmation:
    """Measure the summary's commit and the revision before it until their moved configs
    decide, or ``deadline`` (time.monotonic()) passes."""
    assert summary.previous is not None, "a step has a revision before it"
    previous, revision = summary.previous, summary.revision
    moved = sorted({s.config for s in summary.steps if s.regression})
    started = time.monotonic()
    rounds = 0
    while True:
        values = {rev: measurer.results(rev) for rev in (previous, revision)}
        samples = {config: ([r.values[metric] for r in values[previous].get(config, [])
                             if metric in r.values],
                            [r.values[metric] for r in values[revision].get(config, [])
                             if metric in r.values]) for config in moved}
        configs = {config: verdict_of(a, b, metric, threshold)
                   for config, (a, b) in samples.items()}
        verdicts = set(configs.values())
        verdict = ("different" if "different" in verdicts
                   else "same" if verdicts == {"same"} else "unknown")
        spent = time.monotonic() - started
        if verdict != "unknown" or time.monotonic() >= deadline or rounds >= MAX_ROUNDS:
            return Confirmation(revision, previous, verdict, rounds, spent, configs)
        rounds += 1
        repeats = max(len(b) for pair in samples.values() for b in pair) + 1
        say(f"track: {revision[:12]} against {previous[:12]} is {verdict}: round {rounds} "
            f"({repeats} runs a side)")
        measurer.run([previous, revision], repeats=repeats)

