"""A history's steps per commit first: for each commit where some series moved, its short sha,
subject and author date (``CommitInfo``, from git: the caller's), how many of the series
measured there moved, the geometric mean of their ratios with its interval, and the devices;
the per-config steps follow (``reports.history.HistoryStep``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from reports.history import History, HistoryStep, worse
from reports.runs import revision_label
from reports.stats import geometric_mean_ci


@dataclass(frozen=True)
class CommitInfo:
    revision: str
    subject: str
    authored: str  # ISO 8601 author date ("" when git does not know the revision)


@dataclass
class CommitSummary:
    experiment: str
    revision: str
    previous: str | None  # the revision measured before it
    subject: str
    authored: str
    measured: int  # series with a point at the revision
    steps: list[HistoryStep] = field(default_factory=list)
    ratio: float | None = None  # geometric mean of the steps' ratios
    low: float | None = None  # its interval (percentile bootstrap over the configs)
    high: float | None = None

    @property
    def devices(self) -> list[str]:
        return sorted({s.device for s in self.steps})

    @property
    def regression(self) -> bool:
        return bool(self.steps) and worse(self.steps[0].metric, self.ratio)

    def line(self) -> str:
        what = "regression" if self.regression else "improvement"
        ratio = "n/a" if self.ratio is None else f"{self.ratio:.3g}x"
        interval = ("" if self.low is None or self.high is None or len(self.steps) < 2
                    else f" [{self.low:.3g}, {self.high:.3g}]")
        date = f" {self.authored[:10]}" if self.authored else ""
        previous = f", after {revision_label(self.previous)}" if self.previous else ""
        return (f"{what} at commit {revision_label(self.revision)}{date} {self.subject!r}: "
                f"{len(self.steps)} of {self.measured} configs moved, geometric mean "
                f"{ratio}{interval}, on {', '.join(self.devices)}{previous}")

    def document(self) -> dict[str, Any]:
        return {"experiment": self.experiment, "revision": self.revision,
                "previous": self.previous, "subject": self.subject,
                "authored": self.authored, "measured": self.measured,
                "moved": len(self.steps), "ratio": self.ratio, "low": self.low,
                "high": self.high, "devices": self.devices, "regression": self.regression,
                "steps": [asdict(s) for s in self.steps]}


def commit_summaries(hist: History, info: dict[str, CommitInfo]) -> list[CommitSummary]:
    """One summary per commit with steps, in commit order."""
    at: dict[str, list[HistoryStep]] = {}
    for step in hist.steps:
        at.setdefault(step.revision, []).append(step)
    out = []
    for revision in (r for r in hist.revisions if r in at):
        index = hist.revisions.index(revision)
        known = info.get(revision, CommitInfo(revision, "", ""))
        measured = sum(any(p.revision == revision for p in s.points) for s in hist.series)
        mean = geometric_mean_ci(s.ratio for s in at[revision])
        out.append(CommitSummary(
            hist.experiment, revision, hist.revisions[index - 1] if index else None, known.subject,
            known.authored, measured, at[revision],
            *((mean.value, mean.low, mean.high) if mean else (None, None, None))))
    return out


def summary_text(hist: History, info: dict[str, CommitInfo]) -> str:
    """The history's table, then per commit its summary and its per-config steps."""
    lines = [hist.text(with_steps=False)]
    summaries = commit_summaries(hist, info)
    for summary in summaries:
        lines.append(summary.line())
        lines += [f"  {step.line()}" for step in summary.steps]
    if not summaries:
        lines.append("no steps beyond noise")
    return "\n".join(lines)
