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

Where the class of the step's board has another board in the inventory, a different step is
then reproduced there (``reproduce``: both revisions run on it, and confirmed the same way);
a step that board does not show is the first board's, not the commit's.

A different step whose runs were measured under other board conditions than the runs before
it (``devices.conditions``: a governor, throttling, a memory clock, a loaded machine, seen in
the snapshots on one side only) does not blame the commit: ``board_change`` names the change,
and the caller records a board event instead of an alert.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from devices.conditions import EMULATED, run_flags
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
            budget_s: float, say: Callable[[str], None]) -> Confirmation:
    """Measure the summary's commit and the revision before it until their moved configs
    decide, or ``budget_s`` seconds of measuring are spent."""
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
        if verdict != "unknown" or spent >= budget_s or rounds >= MAX_ROUNDS:
            return Confirmation(revision, previous, verdict, rounds, spent, configs)
        rounds += 1
        repeats = max(len(b) for pair in samples.values() for b in pair) + 1
        say(f"track: {revision[:12]} against {previous[:12]} is {verdict}: round {rounds} "
            f"({repeats} runs a side)")
        measurer.run([previous, revision], repeats=repeats)


Snapshots = tuple[Any, Any]  # a run's fingerprints before and after it


def condition_shares(runs: list[Snapshots]) -> dict[str, float]:
    """condition -> the share of the runs measured under it (``devices.conditions`` flags but
    ``emulated``)."""
    counted: dict[str, int] = {}
    for before, after in runs:
        for flag in set(run_flags(before, after)) - {EMULATED}:
            counted[flag] = counted.get(flag, 0) + 1
    return {flag: n / len(runs) for flag, n in counted.items()}


def measured_conditions(measurer: Measurer, revision: str, configs: list[str]
                        ) -> dict[str, float]:
    """``condition_shares`` of the runs of these configs at ``revision`` (their snapshots)."""
    pairs = []
    runs = measurer.results(revision)
    for config in configs:
        for run in runs.get(config, []):
            snapshots = {s.get("phase"): s.get("fingerprint")
                         for s in measurer.store.get_run(run.run_id).snapshots}
            pairs.append((snapshots.get("before"), snapshots.get("after")))
    return condition_shares(pairs)


def board_change(before: dict[str, float], after: dict[str, float], previous: str,
                 revision: str) -> str | None:
    """What changed on the board between the runs before a step (``before``: condition
    shares at ``previous``) and the culprit's (``after``): a condition under most runs of one
    side and none of the other (a passing load, which the alternating rounds spread over both
    sides, is no change), or None."""
    parts = []
    for flag in sorted(set(before) | set(after)):
        for here, there, at in ((after, before, revision), (before, after, previous)):
            if here.get(flag, 0.0) > 0.5 and flag not in there:
                parts.append(f"{flag} in {here[flag]:.0%} of the runs at {at[:12]}, none at "
                             "the other")
    return "; ".join(parts) or None


def second_boards(measurer: Measurer, devices: list[str]) -> list[str]:
    """The inventory's boards of the classes of ``devices`` that ``measurer`` does not run
    on, by name."""
    boards = measurer.inventory.devices
    classes = {boards[name].cls for name in devices if name in boards}
    return sorted(b.name for b in boards.values()
                  if b.cls in classes and b.name not in measurer.placement.devices)


def reproduce(measurer: Measurer, summary: CommitSummary, metric: str, threshold: float,
              budget_s: float, say: Callable[[str], None]) -> tuple[str, Confirmation] | None:
    """The step confirmed again on a second board of its board's class (``second_boards``:
    the first of them): both revisions built for it and run there, then ``confirm``ed within
    ``budget_s``; None when the class has no other board."""
    others = second_boards(measurer, summary.devices)
    if not others or summary.previous is None:
        return None
    revisions = [summary.previous, summary.revision]
    say(f"track: reproducing the step at {summary.revision[:12]} on {others[0]}")
    with Measurer(measurer.spec, measurer.inventory, measurer.store, others[0],
                  measurer.ray_address, measurer.stream, measurer.caller) as second:
        for revision in revisions:
            second.build(revision)
        second.run(revisions)
        return others[0], confirm(second, summary, metric, threshold, budget_s, say)
