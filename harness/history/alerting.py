"""The steps a history finds, kept as alerts (``db.alerts``): each commit with a regression
opens (or adds to) its alert, and a later step of a series back to its level before suggests
that alert's fix. Notifications go out when an alert opens and when its state changes
(``alert-opened``, ``alert-state``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from db.alerts import AlertRecord, StepRecord
from db.store import Store
from harness.execution import notify

if TYPE_CHECKING:  # the alerts commands read alerts without the statistics' imports
    from reports.commits import CommitSummary


@dataclass
class Alerting:
    opened: list[AlertRecord] = field(default_factory=list)
    suggested: list[AlertRecord] = field(default_factory=list)  # now fix-suggested


def alert_document(alert: AlertRecord) -> dict[str, Any]:
    """An alert as `alerts show --json`, the dashboard's API and notifications give it."""
    return {"id": alert.id, "experiment": alert.experiment, "revision": alert.revision,
            "previous": alert.previous, "subject": alert.subject,
            "authored": alert.authored_at, "state": alert.state, "ratio": alert.ratio,
            "devices": alert.devices, "created_at": alert.created_at.isoformat(),
            "updated_at": alert.updated_at.isoformat(),
            "steps": [asdict(s) for s in alert.steps],
            "changes": [asdict(c) | {"at": c.at.isoformat()} for c in alert.changes]}


def alert_event(alert: AlertRecord, event: str, **extra: Any) -> dict[str, Any]:
    """A notification about ``alert``: ``alert-opened`` or ``alert-state``."""
    return {"event": event, "alert": alert.id, **alert_document(alert), **extra}


def record_alerts(store: Store, summaries: Iterable[CommitSummary],
                  targets: notify.Targets, notes: dict[str, str] | None = None) -> Alerting:
    """Open an alert for each summary with a regression (``notes``: revision -> what its
    opening records, e.g. its confirmation), and mark the alerts its steps back to an
    earlier level fix-suggested (``summaries`` in commit order)."""
    done = Alerting()
    for summary in summaries:
        for step in summary.steps:
            if not step.regression:
                done.suggested += store.alerts.steps_back(summary.experiment, summary.revision,
                                                          step.device, step.config,
                                                          step.metric, step.after)
        if not any(step.regression for step in summary.steps):
            continue
        alert, new = store.alerts.open(
            summary.experiment, summary.revision, summary.previous, summary.subject,
            summary.authored or None,
            [StepRecord(**asdict(s), regression=s.regression) for s in summary.steps],
            (notes or {}).get(summary.revision))
        if new:
            done.opened.append(alert)
            if targets:
                notify.announce(alert_event(alert, "alert-opened"), targets)
    for alert in done.suggested:
        if targets:
            notify.announce(alert_event(alert, "alert-state", changed_by="benchfarm",
                                        state_from=alert.changes[-1].state_from), targets)
    return done


def said(done: Alerting) -> list[str]:
    """What a command prints of the alerts it opened and changed."""
    return ([f"alert {a.id} opened: {a.revision[:12]} {a.subject!r} (`benchfarm alerts show "
             f"{a.id}`)" for a in done.opened]
            + [f"alert {a.id} fix-suggested: its series are back at the level before "
               f"{a.revision[:12]}" for a in done.suggested])
