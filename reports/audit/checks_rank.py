"""Key-ranking claims (the eviction-prediction article's metrics): a policy's Spearman rho, top-32
recall, mass captured by the top 32 or mass lost at 50 % eviction, as lmc measured them on the run
(``lmc ppl --measure-keys``: the ``rank_<field>`` columns of reports.runs), the median over the runs
of ``a``; with ``b``, the mean over the inputs (windows) both ran of b's figure less a's; with
``params = { layer_a, layer_b }``, a's figure at one layer less at another. The noise is the 95 %
interval of the mean over the windows (the independent repeats).
"""

from __future__ import annotations

import json

import pandas as pd

from reports.audit.claim import Claim
from reports.audit.evidence import (
    Reading,
    describe,
    ok_runs,
    paired_margin,
    paired_mean,
    pairs,
    run_ids,
    select,
)


def _ranked(runs: pd.DataFrame, selector: dict, column: str) -> pd.DataFrame:
    chosen = ok_runs(select(runs, selector))
    return chosen[chosen[column].notna()]


def _layer_figure(extra: object, layer: int, name: str) -> float | None:
    try:
        value = json.loads(str(extra))["key_ranking"]["layers"][layer][name]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return None if value is None else float(value)


def layer_difference(claim: Claim, runs: pd.DataFrame) -> Reading:
    """Per run of a: its figure at layer ``layer_b`` less its figure at ``layer_a`` (the run's
    per-layer key ranking); the mean over the windows, paired within each run."""
    la, lb = int(claim.measure.params["layer_a"]), int(claim.measure.params["layer_b"])
    a = ok_runs(select(runs, claim.measure.a))
    name = claim.measure.field
    figures = [(_layer_figure(e, la, name), _layer_figure(e, lb, name)) for e in a["extra"]]
    diffs = [y - x for x, y in figures if x is not None and y is not None]
    if not diffs:
        return Reading(reason=f"no runs of {describe(claim.measure.a)} with {name} at "
                              f"layers {la} and {lb} (lmc --measure-keys)")
    return paired_mean(diffs, run_ids(a), f"{name} at layer {lb} less layer {la}, per window: "
                       + ", ".join(f"{d:+.3f}" for d in diffs))


def key_rank(claim: Claim, runs: pd.DataFrame) -> Reading:
    if "layer_a" in claim.measure.params:
        return layer_difference(claim, runs)
    column = f"rank_{claim.measure.field}"
    a = _ranked(runs, claim.measure.a, column)
    if a.empty:
        return Reading(reason=f"no successful runs with key-ranking figures for "
                              f"{describe(claim.measure.a)} (a ppl spec with "
                              "engine.measure_keys and an evicting policy measures them)")
    value = float(a[column].median())
    if not claim.measure.b:
        return Reading(value=value, text=f"{value:.3g}", evidence=run_ids(a),
                       detail=f"{claim.measure.field}, median over {len(a)} runs",
                       noise=paired_margin(a[column].tolist()))
    b = _ranked(runs, claim.measure.b, column)
    if b.empty:
        return Reading(reason=f"no successful runs with key-ranking figures for "
                              f"{describe(claim.measure.b)}")
    other = float(b[column].median())
    diffs = [y - x for x, y in pairs(a, b, column)]
    if not diffs:
        return Reading(reason="the two policies were never ranked on the same windows")
    return paired_mean(diffs, run_ids(a, b),
                       f"{claim.measure.field} median {other:.3g} ({describe(claim.measure.b)}) "
                       f"vs {value:.3g} ({describe(claim.measure.a)}); per-window differences "
                       + ", ".join(f"{d:+.3f}" for d in diffs))
