"""Recall claims: does a config find the needle (mean recall over its runs)?

The seed's own pitfall decides fairness: before judging an optimisation, exact attention must
answer. When the baseline recalls less than ``baseline_min_recall`` the prompts do not test the
optimisation, and the claim is not comparable.
"""

from __future__ import annotations

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
                       + f"{describe(claim.measure.a)}: {len(chosen)} runs")
