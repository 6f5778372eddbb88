"""`benchfarm alerts list|show|ack|invalid|wontfix|fixed`: the regressions `track` (or
`history --record`) stored, one alert per culprit commit, and their triage.

``list`` (newest first; ``--state``, ``--experiment``) and ``show ID`` (its moved series with
their ratios, and who changed its state, when, with what note) read the store. ``ack``,
``invalid``, ``wontfix`` and ``fixed ID [--note TEXT]`` move an alert to that state as the
caller (the store's users and tokens: ``benchfarm users``), and announce the change to
``--notify`` targets as an ``alert-state`` event.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from harness.commands.arguments import add_notify
from harness.commands.context import caller_of, store_of
from harness.commands.table import format_table

if TYPE_CHECKING:
    from db.alerts import AlertRecord

ACTIONS = {"ack": "acknowledged", "invalid": "invalid", "wontfix": "wontfix", "fixed": "fixed"}


def register(subparsers: argparse._SubParsersAction) -> None:
    from db.records import ALERT_STATES

    parser = subparsers.add_parser("alerts", help="stored regressions per culprit commit, and "
                                                  "their triage")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listed = actions.add_parser("list", help="the alerts, newest first")
    listed.add_argument("--state", action="append", choices=ALERT_STATES,
                        help="only alerts in this state (repeatable)")
    listed.add_argument("--experiment", help="only this experiment's")
    listed.add_argument("--json", action="store_true", help="print them as JSON")
    shown = actions.add_parser("show", help="one alert: its series, ratios and changes")
    shown.add_argument("id", type=int)
    shown.add_argument("--json", action="store_true", help="print it as JSON")
    for action, state in ACTIONS.items():
        change = actions.add_parser(action, help=f"mark an alert {state}")
        change.add_argument("id", type=int)
        change.add_argument("--note", help="why (recorded with your name and the time)")
        add_notify(change, "announce the change here")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.history.alerting import alert_document, alert_event

    if args.action in ACTIONS:
        from harness.execution.notify import announce, targets_from

        targets = targets_from(args.notify)
        with store_of(args, create=False) as store:
            caller = caller_of(store)
            alert, before = store.alerts.change(args.id, ACTIONS[args.action], caller.name,
                                                caller.checked, args.note)
        if targets:
            announce(alert_event(alert, "alert-state", changed_by=caller.name,
                                 state_from=before), targets)
        print(f"alert {alert.id}: {before} -> {alert.state} by {caller.shown}")
        return 0
    with store_of(args, create=False, read_only=True) as store:
        if args.action == "show":
            alert = store.alerts.get(args.id)
            print(json.dumps(alert_document(alert), indent=2, default=str) if args.json
                  else alert_text(alert))
            return 0
        alerts = store.alerts.list(args.state or (), args.experiment)
    if args.json:
        print(json.dumps([alert_document(a) for a in alerts], indent=2, default=str))
        return 0
    if not alerts:
        print("no alerts")
        return 0
    print(format_table(
        ["id", "state", "experiment", "commit", "subject", "moved", "ratio", "devices",
         "opened"],
        [[a.id, a.state, a.experiment, a.revision[:12], a.subject[:50], len(a.steps),
          None if a.ratio is None else round(a.ratio, 3), ", ".join(a.devices),
          f"{a.created_at:%Y-%m-%d %H:%M}"] for a in alerts]))
    return 0


def alert_text(alert: AlertRecord) -> str:
    date = f" ({alert.authored_at[:10]})" if alert.authored_at else ""
    lines = [f"alert {alert.id}: {alert.state}", f"experiment {alert.experiment}",
             f"commit {alert.revision}{date} {alert.subject!r}",
             f"previous {alert.previous or '-'}", "moved:"]
    lines += [f"  {s.metric} on {s.device}: {s.ratio:.3g}x ({s.before:.4g} -> {s.after:.4g}; "
              f"{s.config})" + (f" back at {s.back_at[:12]}" if s.back_at else "")
              for s in alert.steps]
    lines.append("changes:")
    lines += [f"  {c.at:%Y-%m-%d %H:%M:%S} {c.actor}: {c.state_from or '-'} -> {c.state_to}"
              + (f" ({c.note})" if c.note else "") for c in alert.changes]
    return "\n".join(lines)
