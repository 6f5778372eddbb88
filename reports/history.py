"""A metric across engine revisions: the series per device and config, in commit order, and the
steps found in them (``reports.steps``); `benchfarm history`, `track` and the report's
timelines read it.

``revision_runs`` is the one place that reads what the history is made of: per ok run its
experiment, device, config, engine revision and metric values. The order of the revisions
(git's commit order) comes from the caller, who can ask git (``harness.history.revisions``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import pandas as pd

from db.records import SeriesStep
from reports.metrics import HIGHER_IS_BETTER, METRICS
from reports.plots import Axes, Mark, Series, line_chart, spread_caption
from reports.roofline import IMPOSSIBLE, SHARED, shares_frame
from reports.runs import labelled_for_history, revision_label, without_revision
from reports.stats import median, summarize
from reports.steps import DEFAULT_PARAMS, METHOD, Step, StepParams, detect_steps

# the metrics a history follows, with their units; lower is better but for those named below
POINT_PARAMS = ("ctx", "depth", "seed", "length")


@dataclass(frozen=True)
class RevisionRun:
    """One ok run as a history sees it."""

    run_id: int
    experiment: str
    device: str
    config: str  # the workload point and the engine config, e.g. "decode ctx=128 exact t=1"
    revision: str  # the commit, "<commit>+dirty" for a working tree with engine changes
    source_hash: str  # the engine sources' hash (two revisions may share it)
    values: dict[str, float]  # metric -> value, the metrics the run has
    code_hash: str = ""  # the sources' code without comments (the source hash if unknown)
    impossible: tuple[str, ...] = ()  # metrics whose figure is beyond the board's roofline
    # metric -> the figure's share of its board's roofline, where judged (reports.roofline)
    shares: tuple[tuple[str, float], ...] = ()


def revision_runs(store: Any, experiment: str) -> list[RevisionRun]:
    """Every ok run of ``experiment`` with its revision and metric values (the stored runs),
    read with only what a history needs (``Store.history_frame``); a figure beyond its
    board's roofline (``reports.roofline``) is flagged impossible."""
    frame = labelled_for_history(store.history_frame(experiment))
    limits = store.board_limits(sorted(set(frame["device"]))) if len(frame) else {}
    return runs_by_revision(frame, limits)


def runs_by_revision(runs: pd.DataFrame,
                     limits: dict[str, dict[str, Any]] | None = None) -> list[RevisionRun]:
    """``revision_runs`` of an experiment's flattened runs (``reports.runs``); with the boards'
    ``limits`` (``Store.board_limits``), the figures beyond them flagged impossible."""
    chosen = runs[(runs["status"] == "ok") & runs["build_revision"].notna()]
    metrics = [m for m in METRICS if m in chosen]
    values = [[float(v) if v is not None and not pd.isna(v) and math.isfinite(v) else None
               for v in chosen[m]] for m in metrics]
    labels: dict[tuple, str] = {}  # a label per distinct point and config
    points = []
    for row in zip(*(chosen[c].tolist() for c in ("kind", *POINT_PARAMS, "config")),
                   strict=True):
        key = tuple((value.__class__, value) for value in row)  # 1 and True label apart
        if key not in labels:
            labels[key] = _point_label(dict(zip(("kind", *POINT_PARAMS, "config"), row,
                                                strict=True)))
        points.append(labels[key])
    codes = (chosen["build_code_hash"] if "build_code_hash" in chosen
             else chosen["build_source_hash"])
    shares = roofline_shares(chosen, limits or {})
    return [RevisionRun(int(run_id), str(experiment), str(device), point, str(revision),
                        str(source), {m: column[i] for m, column in zip(metrics, values,
                                                                       strict=True)
                                      if column[i] is not None},
                        str(code) if isinstance(code, str) else str(source),
                        tuple(m for m, share in shares[i] if share > IMPOSSIBLE), shares[i])
            for i, (run_id, experiment, device, point, revision, source, code) in enumerate(zip(
                chosen["run_id"], chosen["experiment"], chosen["device"], points,
                chosen["build_revision"], chosen["build_source_hash"], codes, strict=True))]


def roofline_shares(chosen: pd.DataFrame, limits: dict[str, dict[str, Any]]
                    ) -> list[tuple[tuple[str, float], ...]]:
    """Per row, each judged figure's share of its board's roofline (``shares_frame``); one
    over ``IMPOSSIBLE`` is a measurement bug, never a level of a history."""
    frame = shares_frame(chosen, limits)[list(SHARED)]
    return [tuple((metric, float(share)) for metric, share in zip(SHARED, row, strict=True)
                  if share == share) for row in frame.itertuples(index=False)]


def _point_label(row: dict[str, Any]) -> str:
    parts = [str(row["kind"])]
    for name in POINT_PARAMS:
        value = row.get(name)
        if value is not None and not pd.isna(value):
            parts.append(f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}")
    return " ".join(parts + [without_revision(row["config"])])


def worse(metric: str, ratio: float | None) -> bool:
    """Whether a step of this ratio (after / before) is a regression of ``metric``."""
    if ratio is None:
        return False
    return ratio < 1.0 if metric in HIGHER_IS_BETTER else ratio > 1.0


@dataclass
class Point:
    revision: str
    values: list[float]

    def document(self) -> dict[str, Any]:
        summary = summarize(self.values)
        assert summary is not None  # a point has values
        return {"revision": self.revision, "n": summary.n, "median": summary.median,
                "min": summary.min, "max": summary.max, "cv": summary.cv,
                "values": self.values}


@dataclass
class RevisionSeries:
    device: str
    config: str
    points: list[Point]  # in commit order; revisions without runs are left out


@dataclass(frozen=True)
class HistoryStep(SeriesStep):
    """A step a history found, judged by its metric's direction."""

    @property
    def regression(self) -> bool:
        return worse(self.metric, self.ratio)

    def line(self) -> str:
        ratio = "n/a" if self.ratio is None else f"{self.ratio:.3g}x"
        what = "regression" if self.regression else "improvement"
        return (f"{what}: commit {revision_label(self.revision)} {self.metric} on {self.device}: "
                f"{ratio} ({self.before:.4g} -> {self.after:.4g}; {self.config})")


@dataclass(frozen=True)
class BoardStep:
    """A step at a revision whose engine code is the revision before's (one binary, or
    sources that differ only in comments): the same engine measured differently, so the
    board's, never a commit's; with the figure's share of the board's roofline on both sides
    where it is judged (the share the series usually has, and how far below it fell)."""

    step: HistoryStep
    previous: str  # the revision before, with the same code
    share_before: float | None
    share_after: float | None

    def document(self) -> dict[str, Any]:
        return asdict(self.step) | {"previous": self.previous, "share_before": self.share_before,
                                    "share_after": self.share_after}

    def line(self) -> str:
        s = self.step
        ratio = "n/a" if s.ratio is None else f"{s.ratio:.3g}x"
        share = ("no share of the roofline judged" if self.share_before is None
                 or self.share_after is None else
                 f"share of the roofline {self.share_before:.0%} -> {self.share_after:.0%}")
        return (f"board step on {s.device}: {s.metric} {ratio} at {revision_label(s.revision)} "
                f"({s.before:.4g} -> {s.after:.4g}; {s.config}) with the engine's code "
                f"unchanged since {revision_label(self.previous)}: the board's, not a "
                f"commit's; {share}")


@dataclass
class History:
    experiment: str
    metric: str
    revisions: list[str]  # every revision shown, in commit order
    series: list[RevisionSeries] = field(default_factory=list)
    steps: list[HistoryStep] = field(default_factory=list)
    # runs left out: their figure is beyond their board's roofline (reports.roofline)
    impossible: list[RevisionRun] = field(default_factory=list)
    # steps at a revision whose engine code is its predecessor's: the board's, not a commit's
    board_steps: list[BoardStep] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        """What `benchfarm history --json` prints."""
        return {
            "experiment": self.experiment, "metric": self.metric,
            "unit": METRICS.get(self.metric, ""), "revisions": self.revisions,
            "series": [{"device": s.device, "config": s.config, "metric": self.metric,
                        "points": [p.document() for p in s.points]} for s in self.series],
            "steps": [asdict(step) for step in self.steps],
            "impossible": [{"run_id": r.run_id, "device": r.device, "config": r.config,
                            "revision": r.revision, "value": r.values[self.metric]}
                           for r in self.impossible],
            "board_steps": [b.document() for b in self.board_steps],
        }

    def text(self, with_steps: bool = True) -> str:
        """A table: one row per series, one column per revision (medians), then the steps."""
        heads = [revision_label(r) for r in self.revisions]
        rows = []
        for s in self.series:
            by_rev = {p.revision: p for p in s.points}
            cells = []
            for revision in self.revisions:
                point = by_rev.get(revision)
                summary = summarize(point.values) if point else None
                cells.append("" if summary is None else summary.text(3) + f" n={summary.n}")
            rows.append([s.device, s.config, *cells])
        table = pd.DataFrame(rows, columns=["device", "config", *heads])
        unit = METRICS.get(self.metric, "")
        lines = [f"{self.experiment}: {self.metric}" + (f" ({unit})" if unit else "")
                 + " per revision in commit order, median [min, max] over runs",
                 table.to_string(index=False) if rows else "(no runs)"]
        if self.impossible:
            lines.append(f"{len(self.impossible)} run(s) left out: {self.metric} beyond the "
                         f"board's roofline (impossible, a measurement bug): runs "
                         + ", ".join(str(r.run_id) for r in self.impossible[:20]))
        if with_steps:
            lines += [step.line() for step in self.steps] or ["no steps beyond noise"]
            lines += [board.line() for board in self.board_steps]
        return "\n".join(lines)


class StepCache(Protocol):
    """Where the steps found in series are kept (``db.store.Store``'s ``known_steps`` and
    ``keep_steps``; a read-only store keeps nothing)."""

    def known_steps(self, keys: Collection[str]) -> dict[str, list[Any]]: ...

    def keep_steps(self, found: dict[str, list[Any]]) -> None: ...


def series_key(values: Sequence[Sequence[float]], params: StepParams) -> str:
    """What a series' steps are found from: the detector's method, its parameters and the
    values at each point (a series that gains a point or a run gets a new key)."""
    text = json.dumps([METHOD, asdict(params), [list(v) for v in values]])
    return hashlib.sha256(text.encode()).hexdigest()


def found_steps(series: Sequence[Sequence[Sequence[float]]], params: StepParams,
                cache: StepCache | None = None) -> list[list[Step]]:
    """The steps of each series: those ``cache`` keeps, the others found now (and kept)."""
    keys = [series_key(values, params) for values in series]
    known = cache.known_steps(keys) if cache is not None else {}
    fresh: dict[str, list[Any]] = {}
    out = []
    for key, values in zip(keys, series, strict=True):
        if key in known:
            out.append([Step(int(i), before, after) for i, before, after in known[key]])
            continue
        steps = detect_steps(values, params)
        fresh[key] = [[int(s.index), float(s.before), float(s.after)] for s in steps]
        out.append(steps)
    if cache is not None and fresh:
        cache.keep_steps(fresh)
    return out


def history(runs: Sequence[RevisionRun], order: Sequence[str], metric: str,
            devices: Sequence[str] | None = None, configs: Sequence[str] | None = None,
            params: StepParams = DEFAULT_PARAMS, cache: StepCache | None = None) -> History:
    """The series of ``metric`` per (device, config) over the revisions in ``order`` (those of
    the runs not in it follow, in the order of their first run), and the steps in each (kept
    in ``cache`` by what they were found in). A revision whose engine code is its
    predecessor's (one binary, or sources that differ only in comments: ``code_hash``) is the
    same engine: a step found there is noise and is left out."""
    wanted = [r for r in runs if metric in r.values
              and (not devices or r.device in devices) and (not configs or r.config in configs)]
    chosen = [r for r in wanted if metric not in r.impossible]
    seen = list(dict.fromkeys(r.revision for r in sorted(chosen, key=lambda r: r.run_id)))
    seen_set, ordered = set(seen), set(order)
    revisions = [r for r in order if r in seen_set] + [r for r in seen if r not in ordered]
    result = History(chosen[0].experiment if chosen else "", metric, revisions,
                     impossible=[r for r in wanted if metric in r.impossible])
    groups: dict[tuple[str, str], dict[str, list[float]]] = {}
    for run in chosen:
        groups.setdefault((run.device, run.config), {}).setdefault(run.revision, []).append(
            run.values[metric])
    for (device, config), by_rev in sorted(groups.items()):
        points = [Point(rev, by_rev[rev]) for rev in revisions if rev in by_rev]
        result.series.append(RevisionSeries(device, config, points))
    code = {r.revision: r.code_hash or r.source_hash for r in chosen}
    shares: dict[tuple[str, str, str], list[float]] = {}
    for run in chosen:
        share = dict(run.shares).get(metric)
        if share is not None:
            shares.setdefault((run.device, run.config, run.revision), []).append(share)
    found = found_steps([[p.values for p in s.points] for s in result.series], params, cache)
    for series, steps in zip(result.series, found, strict=True):
        for step in steps:
            revision = series.points[step.index].revision
            previous = series.points[step.index - 1].revision
            moved = HistoryStep(revision, series.device, series.config, metric, step.before,
                                step.after, step.ratio)
            if code[revision] != code[previous]:
                result.steps.append(moved)
                continue
            # the same engine code as the revision before: what moved is the board
            result.board_steps.append(BoardStep(moved, previous, *(
                median(shares[key]) if (key := (series.device, series.config, rev))
                in shares else None for rev in (previous, revision))))
    return result


def revision_histories(runs: pd.DataFrame, order: Sequence[str],
                       cache: StepCache | None = None) -> list[History]:
    """The history of each metric an experiment's flattened runs have, when they hold more
    than one engine revision (none otherwise): the report's and the dashboard's."""
    return histories_of(runs_by_revision(runs), order, cache)


def histories_of(found: Sequence[RevisionRun], order: Sequence[str],
                 cache: StepCache | None = None) -> list[History]:
    """The history of each metric the runs have, when they hold more than one revision."""
    if len({r.revision for r in found}) < 2:
        return []
    return [hist for metric in METRICS
            if (hist := history(found, order, metric, cache=cache)).series]


def first_run_order(runs: Iterable[RevisionRun]) -> list[str]:
    """The runs' revisions in the order of their first run: what to hand a revision order
    (``harness.identity.commit_order`` keeps it for the revisions git does not know), so that
    every history of an experiment (report, `history`, `track`, the dashboard, the steps kept
    when runs land) orders them alike and finds its steps kept."""
    return list(dict.fromkeys(r.revision for r in sorted(runs, key=lambda r: r.run_id)))


def keep_steps_of(store: Any, experiment: str, revision_order: Any) -> None:
    """Find and keep (in the store) the steps of every series of the experiment's history
    that the store does not keep yet: what a coordinator does when its runs have landed, so
    that reports and pages find them. ``revision_order`` puts revisions in commit order."""
    found = revision_runs(store, experiment)
    histories_of(found, revision_order(first_run_order(found)), store)


def timeline_section_parts(runs: pd.DataFrame, order: Sequence[str],
                           cache: StepCache | None = None,
                           histories: list[History] | None = None
                           ) -> tuple[list[tuple[str, str]], pd.DataFrame]:
    """The report's history of an experiment with several revisions: a timeline per metric
    and device, and the table of the steps found (empty when it holds one revision): a
    commit's, or the board's where the engine code is the revision before's. ``histories``:
    those already made of the runs (``histories_of`` the store's ``revision_runs``, as the
    dashboard makes them for its own view), else they are made here."""
    if histories is None:
        histories = revision_histories(runs, order, cache)
    figures = [figure for hist in histories for figure in timeline_figures(hist)]
    steps = [asdict(step) | {"cause": "commit"} for hist in histories for step in hist.steps]
    steps += [asdict(board.step) | {"cause": f"board (code of {revision_label(board.previous)})"}
              for hist in histories for board in hist.board_steps]
    return figures, pd.DataFrame(steps, columns=STEP_COLUMNS)


STEP_COLUMNS = ["revision", "device", "config", "metric", "before", "after", "ratio", "cause"]


def timeline_figures(hist: History) -> list[tuple[str, str]]:
    """One timeline per device: every config's medians over the revisions (x: commit order),
    each detected step a dashed red line at its commit labelled with its ratio."""
    figures = []
    position = {rev: i for i, rev in enumerate(hist.revisions)}
    for device in sorted({s.device for s in hist.series}):
        series, marks = [], []
        for s in (s for s in hist.series if s.device == device):
            series.append(Series(s.config, [(float(position[p.revision]),
                                             median(p.values))
                                            for p in s.points],
                                 spread=[(float(position[p.revision]), min(p.values),
                                          max(p.values)) for p in s.points
                                         if len(p.values) > 1]))
        for step in hist.steps:
            if step.device == device:
                marks.append(Mark(float(position[step.revision]),
                                  "" if step.ratio is None else f"x{step.ratio:.2g}"))
        unit = METRICS.get(hist.metric, "")
        title = f"{hist.metric} by revision: {device}" + (
            spread_caption(len({x for s in series for x, _ in s.points}))
            if any(s.spread for s in series) else "")
        axes = Axes("revision (commit order)", f"{hist.metric}" + (f" ({unit})" if unit else ""),
                    x_ticks=[float(i) for i in range(len(hist.revisions))],
                    x_tick_labels=[revision_label(r)[:7] for r in hist.revisions])
        figures.append((title, line_chart(title, series, axes, marks)))
    return figures
