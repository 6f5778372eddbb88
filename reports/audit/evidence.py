"""The runs a claim is judged on, and what a check returns.

``select`` picks runs by a selector from the claims file (``{policy = "sparse", k = 32}``); a
check returns a ``Reading``: the figure it read off the runs (or computed), or the reason why
nothing comparable could be measured, plus its evidence (the ids of the runs it used, or for a
check without runs what it rests on) and the noise of our side: the half-width of a 95 %
interval of the value from independent paired repeats (``paired_margin``), 0 for exact counts,
None when there were no independent repeats to measure it from. (A ``Measurement`` is a stored
attempt at a run, ``db/models.py``: a reading rests on some of them.)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from scipy import stats

from db import lmc_axes
from reports.audit.provenance import Provenance

# Selector keys whose values are compared as numbers (ctx 2061 matches 2061.0).
NUMERIC_KEYS = {"k", "block", "probes", "threads", "ctx", "depth", "seed", "length",
                "kv_budget"}
# Where selector keys live in the flattened runs table (reports.runs.flatten_runs).
COLUMNS = {"device_class": "device_class", "device": "device"}
SWITCHES = {s.name: s for s in lmc_axes.SWITCHES}


@dataclass(frozen=True)
class Units:
    """The independent units a figure rests on: distinct prompts, windows, seeds or inputs,
    never repeats of a deterministic run or retries of one run."""

    count: int
    what: str

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "what": self.what}


def units_of(runs: pd.DataFrame) -> Units:
    """The distinct inputs (workloads) of these runs, with what they were."""
    if runs.empty or "workload_id" not in runs:
        return Units(0, "no runs")
    parts = []
    for kind, group in runs.groupby(runs["kind"].fillna("input"), sort=True):
        seeds = sorted({int(s) for s in pd.to_numeric(group.get("seed"), errors="coerce")
                        .dropna()}) if "seed" in group else []
        name = {"needle": "needle prompts", "ppl": "text windows",
                "attn-bench": "synthetic inputs"}.get(str(kind), f"{kind} inputs")
        seed_text = f" (seeds {', '.join(map(str, seeds))})" if seeds else ""
        parts.append(f"{group['workload_id'].nunique()} {name}{seed_text}")
    return Units(int(runs["workload_id"].nunique()), "; ".join(parts))


@dataclass
class Reading:
    """The figure a check read for one claim, with its evidence."""

    value: float | None = None
    text: str = ""  # the value as shown (with its unit / context)
    evidence: list[int] = field(default_factory=list)  # run ids
    reason: str | None = None  # set when nothing comparable was measured
    detail: str = ""
    noise: float | None = None  # half-width of the value's 95 % interval (see the module)
    provenance: Provenance | None = None  # a check without runs says what it rests on
    units: Units | None = None  # a check without runs says its units; else from the runs


def paired_margin(values: Sequence[float]) -> float | None:
    """Half-width of the 95 % t-interval of the mean of independent paired values (e.g. per-window
    differences), or None with fewer than two."""
    if len(values) < 2:
        return None
    return float(stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values)
                 / math.sqrt(len(values)))


def paired_mean(diffs: Sequence[float], ids: list[int], detail: str, unit: str = "") -> Reading:
    """The mean of per-input paired differences, its 95 % interval as the noise."""
    mean = sum(diffs) / len(diffs)
    return Reading(value=mean, text=f"{mean:+.3g}{unit}", evidence=ids, detail=detail,
                   noise=paired_margin(diffs))


# what makes two runs a pair: the same device, input (workload) and repeat
PAIR_KEYS = ["device", "workload_id", "repeat"]


def pairs(a: pd.DataFrame, b: pd.DataFrame, column: str) -> list[tuple[float, float]]:
    """(a, b) values of ``column`` of the runs of a and b on the same device, input and repeat."""
    merged = a[[*PAIR_KEYS, column]].merge(b[[*PAIR_KEYS, column]], on=PAIR_KEYS,
                                           suffixes=("_a", "_b"))
    return [(float(x), float(y)) for x, y in zip(merged[f"{column}_a"], merged[f"{column}_b"],
                                                 strict=True)]


def _label_has(runs: pd.DataFrame, word: str) -> pd.Series:
    return runs["config"].astype(str).map(lambda label: word in label.split())


def select(runs: pd.DataFrame, selector: dict[str, list[Any]]) -> pd.DataFrame:
    """The runs matching every key of ``selector``; engine switches and gbm's trees (``trees=``
    and the start of the file's sha256) are read from the run's config label."""
    mask = pd.Series(True, index=runs.index)
    for key, values in selector.items():
        if key in SWITCHES:  # in the label exactly when set away from the default
            wanted = {bool(v) != SWITCHES[key].default for v in values}
            mask &= _label_has(runs, SWITCHES[key].label).isin(wanted)
            continue
        if key == "predictor":
            mask &= pd.concat([_label_has(runs, v) for v in values], axis=1).any(axis=1)
            continue
        column = runs[COLUMNS.get(key, key)]
        if key in NUMERIC_KEYS:
            numbers = pd.to_numeric(column, errors="coerce")
            mask &= numbers.map(lambda v, vs=values: v is not None and not math.isnan(v)
                                and any(abs(v - float(x)) < 1e-9 for x in vs))
        else:
            mask &= column.astype(str).isin([str(v) for v in values])
    return runs[mask]


def describe(selector: dict[str, list[Any]]) -> str:
    return ", ".join(f"{k}={'/'.join(map(str, v))}" for k, v in selector.items()) or "all runs"


def ok_runs(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["status"] == "ok"]


def run_ids(*frames: pd.DataFrame) -> list[int]:
    return sorted({int(i) for frame in frames for i in frame["run_id"]})
