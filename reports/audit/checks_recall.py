"""Recall claims: does a config find the needle (mean recall over its runs)?

The seed's own pitfall decides fairness: before judging an optimisation, exact attention must
answer. When the baseline recalls less than ``baseline_min_recall`` the prompts do not test the
optimisation, and the claim is not comparable.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from reports.audit.claims_file import Claim
from reports.audit.evidence import Measurement, describe, ok_runs, run_ids, select


def recall(claim: Claim, runs: pd.DataFrame) -> Measurement:
    chosen = ok_runs(select(runs, claim.measure.a))
    chosen = chosen[chosen["recall"].notna()]
    if chosen.empty:
        return Measurement(reason=f"no successful needle runs for {describe(claim.measure.a)}")
    used = [chosen]
    detail = ""
    if claim.measure.baseline is not None:
        baseline = ok_runs(select(runs, claim.measure.baseline))
        baseline = baseline[baseline["recall"].notna()]
        if baseline.empty:
            return Measurement(reason=f"no baseline runs ({describe(claim.measure.baseline)}) "
                                      "to show that the model answers these prompts at all")
        base = float(baseline["recall"].mean())
        used.append(baseline)
        detail = f"baseline {describe(claim.measure.baseline)} recall {base:.3g}"
        if base < claim.measure.baseline_min_recall:
            return Measurement(
                value=None, evidence=run_ids(*used), detail=detail,
                reason=f"the baseline itself recalls only {base:.3g} (< "
                       f"{claim.measure.baseline_min_recall:g}): the prompts do not test the "
                       "optimisation")
    value = float(chosen["recall"].mean())
    hits = int((chosen["recall"] >= 1.0).sum())
    return Measurement(value=value, text=f"{value:.3g} ({hits}/{len(chosen)} runs recalled)",
                       evidence=run_ids(*used),
                       detail=f"{detail}; " * bool(detail)
                       + f"{describe(claim.measure.a)}: {len(chosen)} runs",
                       noise=0.0)  # an exact count


def critical_k(claim: Claim, runs: pd.DataFrame) -> Measurement:
    """The smallest k of a's scan from which every larger k recalls every prompt (the seed's
    "critical k"); the baseline must answer first, as for recall."""
    chosen = ok_runs(select(runs, claim.measure.a))
    chosen = chosen[chosen["recall"].notna() & chosen["k"].notna()]
    if chosen.empty:
        return Measurement(reason=f"no successful needle runs for {describe(claim.measure.a)}")
    baseline = recall(replace(claim, measure=replace(claim.measure, a=claim.measure.baseline
                                                     or claim.measure.a)), runs)
    if claim.measure.baseline is not None and baseline.reason:
        return baseline
    per_k = chosen.groupby("k")["recall"].mean().sort_index()
    critical = None
    for k in sorted(per_k.index, reverse=True):
        if per_k[k] < 1.0:
            break
        critical = int(k)
    scan = ", ".join(f"k={int(k)}: {r:.2f}" for k, r in per_k.items())
    if critical is None:
        return Measurement(reason=f"no k of the scan recalls every prompt ({scan})",
                           evidence=run_ids(chosen))
    return Measurement(value=float(critical), text=f"k = {critical}", evidence=run_ids(chosen),
                       detail=f"mean recall per k: {scan}", noise=0.0)
