"""The runs a claim is judged on, and what a check returns.

``select`` picks runs by a selector from the claims file (``{policy = "sparse", k = 32}``); a
check returns a ``Measurement``: the measured value, or the reason why nothing comparable could
be measured, plus the ids of the runs it used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

# Selector keys whose values are compared as numbers (ctx 2061 matches 2061.0).
NUMERIC_KEYS = {"k", "block", "probes", "threads", "ctx", "depth", "seed", "length",
                "kv_budget"}
# Where selector keys live in the flattened runs table (reports.runs.flatten_runs).
COLUMNS = {"device_class": "device_class", "device": "device"}


@dataclass
class Measurement:
    value: float | None = None
    text: str = ""  # the value as shown (with its unit / context)
    evidence: list[int] = field(default_factory=list)  # run ids
    reason: str | None = None  # set when nothing comparable was measured
    detail: str = ""


def select(runs: pd.DataFrame, selector: dict[str, list[Any]]) -> pd.DataFrame:
    mask = pd.Series(True, index=runs.index)
    for key, values in selector.items():
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
