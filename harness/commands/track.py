"""`benchfarm track SPEC --since REV`: run the spec on every new commit of engine/ (nightly)."""

from __future__ import annotations

import argparse
import sys
import time
from itertools import groupby
from typing import TYPE_CHECKING

from harness.commands.arguments import add_measuring, add_notify, add_threshold
from harness.commands.context import inventory_of, measuring, spec_of

if TYPE_CHECKING:
    from harness.history.measure import Measurer
    from reports.commits import CommitSummary


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "track", help="run a spec on every new commit of engine/ and report regressions")
    parser.add_argument("spec", help="the experiment spec (TOML)")
    parser.add_argument("--since", required=True,
                        help="the first revision to track (later runs pick up after the last "
                             "tracked commit)")
    add_measuring(parser, "the metric whose regressions are reported")
    add_threshold(parser, "smallest relative step reported")
    add_notify(parser, "announce each regression here, besides the spec's [notify]")
    parser.add_argument("--confirm-budget", type=float, default=None, metavar="SECONDS",
                        help="before blaming a commit, measure it and the revision before it "
                             "again in alternating rounds until they differ or are the same, "
                             "within this much measuring time per step; only a confirmed step "
                             "opens an alert (default: the spec's [track] confirm_budget_s, "
                             "else 0: no confirmation)")
    parser.add_argument("--ends-only", action=argparse.BooleanOptionalAction, default=None,
                        help="measure only the newest new commit (a nightly that measures the "
                             "night's ends); a confirmed step that spans several commits is "
                             "bisected to the first bad one within the confirmation budget "
                             "(default: the spec's [track] ends_only, else measure every new "
                             "commit)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.execution.notify import targets_from
    from harness.history.alerting import record_alerts, said
    from harness.history.track import regression_hook, track

    spec = spec_of(args)
    targets = targets_from(args.notify, spec.notify)
    with measuring(args, spec, inventory_of(args)) as measurer:
        result = track(measurer, args.since, args.metric, args.threshold,
                       lambda line: print(line, file=sys.stderr, flush=True),
                       regression_hook(targets),
                       spec.ends_only if args.ends_only is None else args.ends_only)
        budget = spec.confirm_budget_s if args.confirm_budget is None else args.confirm_budget
        for (device, _), steps in groupby(result.board_steps,
                                          key=lambda b: (b.step.device, b.step.revision)):
            reason = "; ".join(board.line() for board in steps)
            measurer.store.boards.note(device, reason, "benchfarm track")
            print(f"track: board event on {device}: {reason}")
        summaries, notes = judged(measurer, result.summaries, args, budget)
        alerting = record_alerts(measurer.store, summaries, targets, notes)
    for line in said(alerting):
        print(line)
    print(f"track: {len(result.new)} new revision(s) run, {len(result.skipped)} skipped, "
          f"{len(result.regressions)} regression(s); `benchfarm history {spec.name}` shows them")
    return 0


def judged(measurer: Measurer, summaries: list[CommitSummary], args: argparse.Namespace,
           budget_s: float) -> tuple[list[CommitSummary], dict[str, str]]:
    """The summaries that blame their commit (the others' steps that are not regressions too:
    they may suggest a fix), and a note per blamed one. A step whose runs had the engine
    waiting for its CPUs (``boards.cpu_waiting``, read from the stored runs) records a board
    event. With ``budget_s``, a step is then confirmed, checked for a change of the board's
    conditions, reproduced on another board of its class where the inventory has one, and
    bisected when it spans several engine commits, all within ``budget_s`` of measuring per
    step; the night's matrix is not part of it (it measures every new commit, not one step)."""
    from harness.history.boards import board_change, cpu_waiting, measured_conditions, reproduce
    from harness.history.confirm import confirm
    from harness.history.track import narrow

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    kept, notes = [], {}
    for summary in summaries:
        if not any(step.regression for step in summary.steps) or summary.previous is None:
            kept.append(summary)
            continue
        moved = sorted({s.config for s in summary.steps if s.regression})
        waited = cpu_waiting(measurer, summary.previous, summary.revision, moved, args.metric)
        if waited:
            board_event(measurer, summary, args.metric, waited)
            continue
        if budget_s <= 0:
            kept.append(summary)
            continue
        say(f"track: confirming the step at {summary.revision[:12]} within {budget_s:g} s of "
            "measuring (confirmation rounds, a second board, bisection; the night's matrix "
            "is not counted)")
        deadline = time.monotonic() + budget_s
        checked = confirm(measurer, summary, args.metric, args.threshold, deadline, say)
        print(checked.line())
        if checked.verdict != "different":
            print(f"track: no alert for {summary.revision[:12]}: the step is not confirmed "
                  f"({checked.verdict})")
            continue
        note = checked.line()
        changed = board_change(measured_conditions(measurer, checked.previous, moved,
                                                   args.metric),
                               measured_conditions(measurer, checked.revision, moved,
                                                   args.metric),
                               checked.previous, checked.revision) or cpu_waiting(
            measurer, checked.previous, checked.revision, moved, args.metric)
        if changed:
            changed = f"it coincides with a change of the board's conditions ({changed})"
        second = None if changed else reproduce(measurer, summary, args.metric,
                                                args.threshold, deadline, say)
        if second is not None:
            board, again = second
            print(f"on {board}: {again.line()}")
            if again.verdict == "different":
                note += f"; reproduced on {board}: {again.line()}"
            else:
                changed = f"not seen on {board}, a second board of its class ({again.verdict})"
        if changed:
            board_event(measurer, summary, args.metric, changed)
            continue
        culprit, found = narrow(measurer, summary, args.metric, args.threshold, deadline, say)
        kept.append(culprit)
        notes[culprit.revision] = note + (f"; bisected: {found.line(args.metric)}"
                                          if found else "")
        if found:
            print(f"track: bisected: {found.line(args.metric)}")
    return kept, notes


def board_event(measurer: Measurer, summary: CommitSummary, metric: str, why: str) -> None:
    """Record (and say) that the step at the summary's commit is its boards', not the
    commit's: an event in each board's history (`devices health`), no alert."""
    reason = (f"a step of {metric} at {summary.revision[:12]} is the board's, not the "
              f"commit's: {why}")
    for device in summary.devices:
        measurer.store.boards.note(device, reason, "benchfarm track")
    print(f"track: board event on {', '.join(summary.devices)}: {reason}")
