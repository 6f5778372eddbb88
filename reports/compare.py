"""`benchfarm compare A B`: two devices, device classes or engine revisions, config by config.

For every config run on both sides (same workload point and engine config; when comparing
revisions also the same device): the median timing of each, the ratio B/A, a Mann-Whitney U test
with a noise threshold (``reports.stats.compare_samples``), and whether the generated tokens are
identical (else the first divergent step). The samples are independent runs: the repeats, and
with ``--all-measurements`` every measurement of them, never the decode steps of one run; too
few runs a side is ``inconclusive``, with the runs a side a test needs.

The summary leads: the metric and its unit, the geometric mean of the ratios with a bootstrap
CI, and the counts of faster / slower / unchanged / inconclusive configs, overall and per
policy, weight format and device pair; flags that every row carries are said there once.

A/A mode (A == B) splits each config's repeats into even and odd and compares the halves: the
ratios it finds between identical configs are the noise floor, which then serves as threshold.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from db.measurements import CURRENT, Selection
from reports.cells import cell_rows, merge_flags, plain_key
from reports.cpu import mixed_cpu_flag
from reports.errors import ReportInputError
from reports.metrics import TIMINGS
from reports.outdir import output_dir
from reports.runs import first_divergence, flatten_runs, without_revision
from reports.runs import generated_tokens as tokens
from reports.stats import (
    ALPHA,
    NOISE_THRESHOLD,
    VERDICTS,
    compare_samples,
    geometric_mean_ci,
    median,
    noise_floor,
)
from reports.tables import CSS, to_html, to_markdown, write_csv

POINT = ["command", "kind", "ctx", "depth", "seed", "length"]
DIRTY = "+dirty"  # a stored revision's suffix: the working tree, with engine changes
COLUMNS = POINT[1:] + ["config", "device", "policy", "wq", "pair", "n_a", "n_b", "median_a",
                       "median_b", "ratio", "p_value", "change", "needed", "tokens", "flags"]
# The roll-ups of the summary: the column of the rows each groups by, and its name.
ROLLUPS = (("policy", "policy"), ("wq", "weight format"), ("pair", "device pair"))


@dataclass
class Side:
    text: str  # as the user wrote it
    kind: str  # device | class | revision
    mask: pd.Series


@dataclass
class Comparison:
    a: Side
    b: Side
    metric: str
    threshold: float
    noise_floor: float | None  # from A/A on side A, when measurable
    table: pd.DataFrame  # one row per config
    common_flags: list[str] = field(default_factory=list)  # carried by every row: said once
    experiments: list[str] = field(default_factory=list)  # those read; several are said first

    @property
    def unit(self) -> str:
        return TIMINGS.get(self.metric, "ms")

    def summary(self) -> str:
        """What the comparison found, in one paragraph that leads every rendering."""
        floor = "n/a" if self.noise_floor is None else f"{100 * self.noise_floor:.1f} %"
        sides = (f"{self.a.text}: even against odd repeats" if self.a.text == self.b.text
                 else f"B = {self.b.text} vs A = {self.a.text}")
        text = (f"MIXES {len(self.experiments)} EXPERIMENTS ({', '.join(self.experiments)}; "
                "--experiment NAME compares within one): " if len(self.experiments) > 1 else "")
        text += (f"{sides}; {self.metric} in {self.unit} (lower is better), ratio B/A "
                f"(> 1: B slower) over {len(self.table)} common configs")
        mean = geometric_mean_ci(self.table["ratio"]) if len(self.table) else None
        if mean is not None:
            text += f": geometric mean {mean.text()}"
        text += f"; {_counts(self.table)}"
        needed = self.table.loc[self.table["change"] == "inconclusive", "needed"].dropna()
        if len(needed):
            text += (f" (inconclusive: fewer than {int(needed.max())} independent runs a side; "
                     f"set repeats = {int(needed.max())} or more)")
        text += (f"; significance: Mann-Whitney U over independent runs, alpha {ALPHA}, change "
                 f"threshold {100 * self.threshold:.1f} %; A/A noise floor of {self.a.text}: "
                 f"{floor}")
        if self.common_flags:
            text += f"; every row: {_by_side(self.common_flags)}"
        return text + "."

    def rollups(self) -> pd.DataFrame:
        """Per policy, weight format and device pair: configs, geometric mean of the ratios
        with its CI, and the verdict counts."""
        rows = []
        for column, name in ROLLUPS:
            if column not in self.table or self.table[column].isna().all():
                continue
            for value, group in self.table.groupby(column, sort=True):
                mean = geometric_mean_ci(group["ratio"])
                rows.append({"by": name, "value": value, "configs": len(group),
                             "geomean": None if mean is None else mean.value,
                             "ci_low": None if mean is None else mean.low,
                             "ci_high": None if mean is None else mean.high,
                             **{v: int((group["change"] == v).sum()) for v in VERDICTS}})
        return pd.DataFrame(rows, columns=["by", "value", "configs", "geomean", "ci_low",
                                           "ci_high", *VERDICTS])


def _by_side(flags: list[str]) -> str:
    """``A: loaded; B: emulated; B: loaded`` said as ``A: loaded; B: emulated, loaded``."""
    sides: dict[str, list[str]] = {}
    for flag in flags:
        side, colon, what = flag.partition(": ")
        sides.setdefault(side if colon else "", []).append(what if colon else flag)
    return "; ".join(f"{side}: {', '.join(items)}" if side else ", ".join(items)
                     for side, items in sides.items())


def _counts(table: pd.DataFrame) -> str:
    return ", ".join(f"{int((table['change'] == v).sum()) if len(table) else 0} {v}"
                     for v in VERDICTS)


def load_runs(store: Any, experiments: list[str] | None,
              selection: Selection = CURRENT, sides: Collection[str] = ()) -> pd.DataFrame:
    """The flattened runs of these experiments, one row per measurement read; by default those
    of every experiment holding runs of ``sides`` (boards, classes, engines, revisions: see
    ``resolve``), or of every experiment when no side is given."""
    if experiments:
        names = experiments
    elif sides:
        names = store.experiments_measuring(sides)
        if not names:
            raise ReportInputError(
                f"no stored run was measured on, by or at {' or '.join(map(repr, sides))} "
                "(a device, a device class, an engine or an engine revision); `benchfarm "
                "devices list` shows the boards, `benchfarm runs list` the runs")
    else:
        names = store.list_experiments()
    # boards against boards: only their measurements are read (resolve names a device first)
    boards = list(sides) if sides and store.boards_among(sides) == set(sides) else None
    frames = []
    for name in names:
        raw = store.frames(name, selection, summaries=True, boards=boards)
        frames.append(flatten_runs(raw["runs"], raw["outcomes"], raw["snapshots"]))
    if not frames:
        raise ReportInputError("the store holds no experiments to compare")
    # A run may belong to several experiments: count each measurement once.
    runs = pd.concat(frames, ignore_index=True).drop_duplicates("measurement_id",
                                                                ignore_index=True)
    if boards and runs.empty:
        raise ReportInputError(f"no stored run of {', '.join(names)} was measured on "
                               f"{' or '.join(map(repr, boards))}")
    runs.attrs["experiments"] = list(names)
    return runs


def resolve(runs: pd.DataFrame, text: str, named: str | None = None) -> Side:
    """A device name, a device class, an engine (lmc, llama-bench), or an engine revision /
    source hash / binary sha256 (or their prefix). ``named``: what ``text`` names as a
    revision when it is none of the others (a git name resolved to its commit, ``worktree``
    to the working tree's source hash)."""
    for kind, column in (("device", "device"), ("class", "device_class"), ("engine", "engine")):
        mask = runs[column] == text
        if mask.any():
            return Side(text, kind, mask)
    for target in dict.fromkeys(t for t in (named, text) if t):
        for column in ("build_revision", "build_source_hash", "build_binary_sha256"):
            stored = runs[column].fillna("").astype(str)
            # a commit is not its working tree with local changes (<commit>+dirty)
            mask = stored.str.startswith(target) & (stored.str.endswith(DIRTY)
                                                    == target.endswith(DIRTY))
            if len(target) >= 4 and mask.any():
                shown = text if target == text else f"{text} ({target[:12]})"
                return Side(shown, "revision", mask)
    known = (sorted(set(runs["device"])) + sorted(set(runs["device_class"]))
             + sorted(set(runs["engine"])))
    raise ReportInputError(
        f"{text!r} is neither a device, a device class, an engine nor an engine revision in the "
        f"store; devices, classes and engines: {', '.join(dict.fromkeys(known))}; revisions: "
        f"{', '.join(sorted(set(runs['build_revision'].dropna())))}")


def _base_config(config: str) -> str:
    """The config label without the thread count (boards of two classes differ in threads) and
    without the revision (one experiment may hold several)."""
    return " ".join(part for part in without_revision(config).split()
                    if not part.startswith("t="))


class _Cell:
    """One side of a config: its rows of a frame, read from the frame's column lists by
    position (a sub-frame per config costs milliseconds; a nightly holds tens of thousands)."""

    __slots__ = ("columns", "rows")

    def __init__(self, columns: dict[str, list[Any]], rows: list[int]) -> None:
        self.columns, self.rows = columns, rows

    def __getitem__(self, name: str) -> list[Any]:
        column = self.columns[name]
        return [column[i] for i in self.rows]


CELL_COLUMNS = ("config", "wq", "device", "repeat", "generated_ids", "flags", "cpu")


def _columns(runs: pd.DataFrame, metric: str) -> dict[str, list[Any]]:
    """The columns a config's row reads (``_row``), as lists."""
    return {name: runs[name].tolist() for name in (metric, *CELL_COLUMNS) if name in runs}


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _tokens_text(cell_a: _Cell, cell_b: _Cell) -> str:
    ta = [tokens(v) for v in _by_repeat(cell_a, "generated_ids")]
    tb = [tokens(v) for v in _by_repeat(cell_b, "generated_ids")]
    ta, tb = [t for t in ta if t is not None], [t for t in tb if t is not None]
    if not ta or not tb:
        return ""
    step = first_divergence(ta[0], tb[0])
    return "identical" if step is None else f"diverge at step {step}"


def _by_repeat(cell: _Cell, name: str) -> list[Any]:
    """A column of the cell in the order of its repeats, as ``sort_values("repeat")`` gives
    it (the same sort on the same values: ties stay where it puts them)."""
    values = cell[name]
    order = np.asarray(cell["repeat"]).argsort(kind="quicksort")
    return [values[i] for i in order]


def _row(key: dict[str, Any], cell_a: _Cell, cell_b: _Cell, metric: str,
         threshold: float, same_cpu: bool = False) -> dict[str, Any]:
    """One config: each measurement of it is one independent sample."""
    sample_a = [v for v in cell_a[metric] if not _missing(v)]
    sample_b = [v for v in cell_b[metric] if not _missing(v)]
    change = compare_samples(sample_a, sample_b, threshold)
    return key | {
        "policy": str(cell_a["config"][0]).split()[0], "wq": _one(cell_a["wq"]),
        "pair": f"{_boards(cell_a)} -> {_boards(cell_b)}",
        "n_a": len(sample_a), "n_b": len(sample_b),
        "median_a": median(sample_a) if sample_a else None,
        "median_b": median(sample_b) if sample_b else None,
        "ratio": change.ratio, "p_value": change.p_value, "change": change.verdict,
        "needed": change.needed, "tokens": _tokens_text(cell_a, cell_b),
        "flags": _side_flags(cell_a, cell_b, same_cpu)}


def _one(values: list[Any]) -> Any:
    return next((value for value in values if not _missing(value)), None)


def _boards(cell: _Cell) -> str:
    return " / ".join(sorted(set(cell["device"])))


def _side_flags(cell_a: _Cell, cell_b: _Cell, same_cpu: bool) -> list[str]:
    """Why either side's timings deserve distrust (emulated, governor, throttling, runs on more
    than one CPU model), and, where both sides should be the same hardware (revisions and
    engines on one device: ``same_cpu``), that their CPU models differ."""
    items = [f"{side}: {flag}" for side, cell in (("A", cell_a), ("B", cell_b))
             for text in (merge_flags(cell["flags"]), mixed_cpu_flag(cell["cpu"])) if text
             for flag in text.split("; ")]
    if same_cpu and not mixed_cpu_flag(cell_a["cpu"]) and not mixed_cpu_flag(cell_b["cpu"]):
        across = mixed_cpu_flag([*cell_a["cpu"], *cell_b["cpu"]])
        if across:
            items.append(f"A and B ran on different CPUs ({across.partition(': ')[2]})")
    return items


def _pairs(runs_a: pd.DataFrame, runs_b: pd.DataFrame, keys: list[str], metric: str):
    """The configs both sides ran (in A's sorted order): their key and each side's rows. One
    groupby a side, then a dictionary lookup per config."""
    columns_a, columns_b = _columns(runs_a, metric), _columns(runs_b, metric)
    groups_b = {plain_key(k): rows for k, rows in cell_rows(runs_b, keys)}
    for key, rows in cell_rows(runs_a, keys):
        if (found := groups_b.get(plain_key(key))) is not None:
            yield (dict(zip(keys, key, strict=True)), _Cell(columns_a, rows.tolist()),
                   _Cell(columns_b, found.tolist()))


def _table(rows: list[dict[str, Any]]) -> tuple[pd.DataFrame, list[str]]:
    """The rows as a table, and the flags every row carries (taken out of the rows)."""
    if not rows:
        return pd.DataFrame(columns=COLUMNS), []
    common = [f for f in rows[0]["flags"] if all(f in row["flags"] for row in rows)]
    table = pd.DataFrame([row | {"flags": "; ".join(f for f in row["flags"] if f not in common)}
                          for row in rows])
    table = table.rename(columns={"base_config": "config"})
    columns = [c for c in COLUMNS if c in table.columns]  # no device column across devices
    return table[columns], common


def aa_table(runs: pd.DataFrame, metric: str,
             threshold: float) -> tuple[pd.DataFrame, list[str]]:
    """Even against odd repeats of every config: what 'no change' looks like."""
    rows, keys = [], POINT + ["base_config", "device", "revision"]
    columns = _columns(runs, metric)
    repeats = columns.get("repeat", [])
    for key, cell in cell_rows(runs, keys):
        even = [i for i in cell.tolist() if repeats[i] % 2 == 0]
        odd = [i for i in cell.tolist() if repeats[i] % 2 == 1]
        if not even or not odd:
            continue
        rows.append(_row(dict(zip(keys, key, strict=True)), _Cell(columns, even),
                         _Cell(columns, odd), metric, threshold))
    return _table(rows)


def compare(store: Any, a: str, b: str, experiments: list[str] | None = None,
            metric: str = "decode_ms_per_token",
            threshold: float = NOISE_THRESHOLD, lmc_policy: str = "exact",
            selection: Selection = CURRENT, named: dict[str, str] | None = None) -> Comparison:
    sides = dict.fromkeys([a, b, *(named or {}).values()])
    runs = load_runs(store, experiments, selection, sides)
    result = compare_runs(runs, a, b, metric, threshold, lmc_policy, named)
    result.experiments = runs.attrs["experiments"]
    return result


def compare_runs(runs: pd.DataFrame, a: str, b: str, metric: str = "decode_ms_per_token",
                 threshold: float = NOISE_THRESHOLD, lmc_policy: str = "exact",
                 named: dict[str, str] | None = None) -> Comparison:
    """``compare`` on flattened runs (``reports.runs.flatten_runs``), one row per measurement.

    ``lmc_policy``: across engines, the lmc attention policy set against the other engine
    (exact by default: what another engine computes). ``named``: A or B -> the revision it
    names (see ``resolve``)."""
    if metric not in TIMINGS or metric not in runs.columns:
        raise ReportInputError(f"unknown timing {metric!r}; allowed: {', '.join(TIMINGS)}")
    runs = runs[runs["status"] == "ok"].copy()
    runs["base_config"] = runs["config"].map(_base_config)
    named = named or {}
    side_a, side_b = resolve(runs, a, named.get(a)), resolve(runs, b, named.get(b))
    if side_a.kind != side_b.kind:
        raise ReportInputError(f"{a!r} is a {side_a.kind} but {b!r} is a {side_b.kind}; compare "
                               "devices with devices, classes with classes, revisions with "
                               "revisions")
    # across devices or classes, the same engine revision on both sides: revisions never pool
    keys = POINT + ["base_config"] + (["device"] if side_a.kind == "revision" else ["revision"])
    if side_a.kind == "engine":
        runs, keys = _engine_neutral(runs, lmc_policy), POINT[1:] + ["base_config", "device"]
    runs_a = runs[side_a.mask.reindex(runs.index)]
    aa, aa_flags = aa_table(runs_a, metric, threshold)
    floor = noise_floor(aa["ratio"]) if len(aa) else None
    if a == b:
        return Comparison(side_a, side_b, metric, threshold, floor, aa, aa_flags)
    used = max(threshold, floor or 0.0)
    same_cpu = side_a.kind in ("revision", "engine")  # one device on both sides of a pair
    rows = [_row(key, ca, cb, metric, used, same_cpu)
            for key, ca, cb in _pairs(runs_a, runs[side_b.mask.reindex(runs.index)], keys,
                                      metric)]
    table, common = _table(rows)
    return Comparison(side_a, side_b, metric, used, floor, table, common)


def _engine_neutral(runs: pd.DataFrame, lmc_policy: str) -> pd.DataFrame:
    """Across engines, a config is its weight format and threads on the same device and
    workload point; of lmc's policies only ``lmc_policy`` (exact attention, unless a sparse
    policy is what is being set against the other engine) takes part. lmc's configs of that
    policy that differ in anything else (``k``, ``acts=bf16``, ...) stay apart, each against
    the other engine's runs of the same weights and threads."""
    stored = sorted(set(runs["policy"].dropna()))  # only lmc's runs have a policy
    if stored and lmc_policy not in stored:
        raise ReportInputError(f"no lmc runs with policy {lmc_policy!r} to set against the other "
                               f"engine (--lmc-policy); stored policies: {', '.join(stored)}")
    runs = runs[runs["policy"].isna() | (runs["policy"] == lmc_policy)].copy()
    lmc = runs["policy"].notna()
    shared = pd.Series([f"wq={w} t={int(t)}" for w, t in zip(runs["wq"], runs["threads"],
                                                                strict=True)], index=runs.index)
    variant = pd.Series([_lmc_variant(label) if is_lmc else "" for label, is_lmc in
                         zip(runs["config"], lmc, strict=True)], index=runs.index)
    runs["base_config"] = [_with_variant(s, v) for s, v in zip(shared, variant, strict=True)]
    copies = []  # the other engine's runs once more for each further lmc variant
    for key, rows in runs[~lmc].groupby(shared[~lmc]):
        for extra in sorted(set(variant[lmc & (shared == key)]) - {""}):
            copies.append(rows.assign(base_config=_with_variant(str(key), extra)))
    return pd.concat([runs, *copies]) if copies else runs


def _with_variant(shared: str, variant: str) -> str:
    """``wq=W t=T`` with an lmc variant before the threads: ``wq=bf16 acts=bf16 t=1``."""
    weights, threads = shared.split()
    return " ".join(p for p in (weights, variant, threads) if p)


def _lmc_variant(config: str) -> str:
    """What an lmc config label says beyond its policy, weights, threads and revision."""
    parts = without_revision(config).split()[1:]
    return " ".join(p for p in parts if not p.startswith(("wq=", "t=")))


def terminal_table(comparison: Comparison) -> str:
    """The summary first, then the roll-ups, then the rows config by config."""
    rollups = comparison.rollups()
    for column in ("geomean", "ci_low", "ci_high"):
        rollups[column] = rollups[column].map(_number)
    shown = comparison.table.copy()
    for column in ("median_a", "median_b", "ratio", "p_value"):
        shown[column] = shown[column].map(_number)
    shown = shown.rename(columns={"median_a": f"A {comparison.a.text}",
                                  "median_b": f"B {comparison.b.text}"})
    shown = shown.loc[:, [c for c in shown.columns if shown[c].astype(str).str.len().any()]]
    text = shown.to_string(index=False, na_rep="") if len(shown) else "(no common configs)"
    parts = [comparison.summary()]
    if len(rollups):
        parts.append(rollups.to_string(index=False, na_rep=""))
    return "\n\n".join(parts + [text])


def _number(value: Any) -> str:
    return "" if value is None or pd.isna(value) else f"{value:.4g}"


def write_comparison(comparison: Comparison, out_dir: str | Path) -> Path:
    """compare.csv (the rows), compare_summary.csv (the roll-ups), compare.md and a
    self-contained compare.html, each led by the summary; returns the HTML path."""
    out = output_dir(out_dir)
    rollups = comparison.rollups()
    write_csv(comparison.table, out / "compare.csv")
    write_csv(rollups, out / "compare_summary.csv")
    title = f"benchfarm compare: B = {comparison.b.text} vs A = {comparison.a.text}"
    (out / "compare.md").write_text(
        f"# {title}\n\n{comparison.summary()}\n\n{to_markdown(rollups)}\n\n"
        + to_markdown(comparison.table), encoding="utf-8")
    html = (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>"
            f"{escape(title)}</title><style>{CSS}</style></head>\n<body>\n<h1>{escape(title)}"
            f"</h1>\n<p class=\"note\">{escape(comparison.summary())}</p>\n"
            f"{to_html(rollups, 'table-compare-summary')}\n"
            f"{to_html(comparison.table, 'table-compare')}\n</body></html>\n")
    (out / "compare.html").write_text(html, encoding="utf-8")
    return out / "compare.html"
