"""Recall claims: does a config find the needle (mean recall over its runs)?

The block-selection article's own pitfall decides fairness: before judging an optimisation, exact
attention must answer. When the baseline recalls less than ``baseline_min_recall`` the prompts do
not test the optimisation, and the claim is not comparable.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from reports.audit.claim import Claim
from reports.audit.evidence import (
    Reading,
    describe,
    ok_runs,
    paired_mean,
    run_ids,
    select,
)


def recall(claim: Claim, runs: pd.DataFrame) -> Reading:
    chosen = ok_runs(select(runs, claim.measure.a))
    chosen = chosen[chosen["recall"].notna()]
    if chosen.empty:
        return Reading(reason=f"no successful needle runs for {describe(claim.measure.a)}")
    used = [chosen]
    detail = ""
    if claim.measure.baseline is not None:
        baseline = ok_runs(select(runs, claim.measure.baseline))
        baseline = baseline[baseline["recall"].notna()]
        if baseline.empty:
            return Reading(reason=f"no baseline runs ({describe(claim.measure.baseline)}) "
                                  "to show that the model answers these prompts at all")
        base = float(baseline["recall"].mean())
        used.append(baseline)
        detail = f"baseline {describe(claim.measure.baseline)} recall {base:.3g}"
        if base < claim.measure.baseline_min_recall:
            return Reading(
                value=None, evidence=run_ids(*used), detail=detail,
                reason=f"the baseline itself recalls only {base:.3g} (< "
                       f"{claim.measure.baseline_min_recall:g}): the prompts do not test the "
                       "optimisation")
    value = float(chosen["recall"].mean())
    hits = int((chosen["recall"] >= 1.0).sum())
    return Reading(value=value, text=f"{value:.3g} ({hits}/{len(chosen)} runs recalled)",
                   evidence=run_ids(*used),
                   detail=f"{detail}; " * bool(detail)
                   + f"{describe(claim.measure.a)}: {len(chosen)} runs",
                   noise=0.0)  # an exact count


def _critical(chosen: pd.DataFrame) -> tuple[int | None, str]:
    """The smallest k from which every larger k of the scan recalls every prompt of ``chosen``,
    and the scan as text."""
    per_k = chosen.groupby("k")["recall"].mean().sort_index()
    critical = None
    for k in sorted(per_k.index, reverse=True):
        if per_k[k] < 1.0:
            break
        critical = int(k)
    return critical, ", ".join(f"k={int(k)}: {r:.2f}" for k, r in per_k.items())


def _scan(runs: pd.DataFrame, selector: dict) -> pd.DataFrame:
    chosen = ok_runs(select(runs, selector))
    return chosen[chosen["recall"].notna() & chosen["k"].notna()]


def critical_k(claim: Claim, runs: pd.DataFrame) -> Reading:
    """The smallest k of a's scan from which every larger k recalls every prompt (the
    block-selection article's "critical k"); the baseline must answer first, as for recall. With
    ``b``: b's critical k less a's, per prompt (the prompts are the independent repeats: their mean
    and its 95 % interval)."""
    chosen = _scan(runs, claim.measure.a)
    if chosen.empty:
        return Reading(reason=f"no successful needle runs for {describe(claim.measure.a)}")
    if claim.measure.baseline is not None:
        baseline = recall(replace(claim, measure=replace(claim.measure,
                                                         a=claim.measure.baseline)), runs)
        if baseline.reason:
            return baseline
    if claim.measure.b:
        other = _scan(runs, claim.measure.b)
        diffs = []
        for prompt, mine in chosen.groupby("workload_id"):
            theirs = other[other["workload_id"] == prompt]
            ka, kb = _critical(mine)[0], _critical(theirs)[0] if len(theirs) else None
            if ka is not None and kb is not None:
                diffs.append(kb - ka)
        if not diffs:
            return Reading(reason="no prompt has a critical k in both scans")
        return paired_mean(diffs, run_ids(chosen, other),
                           f"per prompt: {', '.join(f'{d:+d}' for d in diffs)}; "
                           f"{describe(claim.measure.a)}: {_critical(chosen)[1]}; "
                           f"{describe(claim.measure.b)}: {_critical(other)[1]}")
    critical, scan = _critical(chosen)
    if critical is None:
        return Reading(reason=f"no k of the scan recalls every prompt ({scan})",
                       evidence=run_ids(chosen))
    return Reading(value=float(critical), text=f"k = {critical}", evidence=run_ids(chosen),
                   detail=f"mean recall per k: {scan}", noise=0.0)
