"""`benchfarm track SPEC --since REV`: run the spec on every new commit of engine/ (nightly)."""

from __future__ import annotations

import argparse
import sys
import time
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
        summaries, notes = result.summaries, {}
        budget = spec.confirm_budget_s if args.confirm_budget is None else args.confirm_budget
        if budget > 0:
            summaries, notes = confirmed(measurer, result.summaries, args, budget)
        alerting = record_alerts(measurer.store, summaries, targets, notes)
    for line in said(alerting):
        print(line)
    print(f"track: {len(result.new)} new revision(s) run, {len(result.skipped)} skipped, "
          f"{len(result.regressions)} regression(s); `benchfarm history {spec.name}` shows them")
    return 0


def confirmed(measurer: Measurer, summaries: list[CommitSummary], args: argparse.Namespace,
              budget_s: float) -> tuple[list[CommitSummary], dict[str, str]]:
    """The summaries whose regressions confirmation finds ``different`` (the others' steps
    that are not regressions too: they may suggest a fix), and a note per confirmed one.
    A confirmed step is reproduced on a second board of its class where the inventory has one,
    then bisected when it spans several engine commits, all within ``budget_s`` per step."""
    from harness.history.confirm import board_change, confirm, measured_conditions, reproduce
    from harness.history.track import narrow

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    kept, notes = [], {}
    for summary in summaries:
        if not any(step.regression for step in summary.steps) or summary.previous is None:
            kept.append(summary)
            continue
        deadline = time.monotonic() + budget_s  # confirming and bisecting share the budget
        checked = confirm(measurer, summary, args.metric, args.threshold, budget_s, say)
        print(checked.line())
        if checked.verdict != "different":
            print(f"track: no alert for {summary.revision[:12]}: the step is not confirmed "
                  f"({checked.verdict})")
            continue
        note = checked.line()
        moved = sorted({s.config for s in summary.steps if s.regression})
        changed = board_change(measured_conditions(measurer, checked.previous, moved),
                               measured_conditions(measurer, checked.revision, moved),
                               checked.previous, checked.revision)
        if changed:
            changed = f"it coincides with a change of the board's conditions ({changed})"
        second = None if changed else reproduce(measurer, summary, args.metric,
                                                args.threshold, deadline - time.monotonic(),
                                                say)
        if second is not None:
            board, again = second
            print(f"on {board}: {again.line()}")
            if again.verdict == "different":
                note += f"; reproduced on {board}: {again.line()}"
            else:
                changed = f"not seen on {board}, a second board of its class ({again.verdict})"
        if changed:
            reason = (f"a step of {args.metric} at {summary.revision[:12]} is the board's, "
                      f"not the commit's: {changed}")
            for device in summary.devices:
                measurer.store.boards.note(device, reason, "benchfarm track")
            print(f"track: board event on {', '.join(summary.devices)}: {reason}")
            continue
        culprit, found = narrow(measurer, summary, args.metric, args.threshold, deadline, say)
        kept.append(culprit)
        notes[culprit.revision] = note + (f"; bisected: {found.line(args.metric)}"
                                          if found else "")
        if found:
            print(f"track: bisected: {found.line(args.metric)}")
    return kept, notes
