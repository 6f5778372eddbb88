"""Timing claims: the ratio of two configs' median timings (B / A) on the same device.

Each device gives its own ratio, with a Mann-Whitney U test over the runs; the claim is judged
on the median of the per-device ratios. Emulated devices are excluded by the fairness rules
before this check sees the runs (their timings are the emulator's, not the hardware's).
"""

from __future__ import annotations

import statistics

import pandas as pd

from reports.audit.claims_file import Claim
from reports.audit.evidence import Measurement, describe, ok_runs, run_ids, select
from reports.stats import compare_samples


def time_ratio(claim: Claim, runs: pd.DataFrame) -> Measurement:
    column = claim.measure.field
    a = ok_runs(select(runs, claim.measure.a))
    b = ok_runs(select(runs, claim.measure.b))
    a, b = a[a[column].notna()], b[b[column].notna()]
    ratios, details = [], []
    for device in sorted(set(a["device"]) & set(b["device"])):
        sample_a = a[a["device"] == device][column].tolist()
        sample_b = b[b["device"] == device][column].tolist()
        change = compare_samples(sample_a, sample_b)
        if change.ratio is None:
            continue
        ratios.append(change.ratio)
        p_text = "" if change.p_value is None else f", p={change.p_value:.2g}"
        details.append(f"{device}: {column} {statistics.median(sample_b):.4g} / "
                       f"{statistics.median(sample_a):.4g} = {change.ratio:.3f} "
                       f"(n={len(sample_a)}/{len(sample_b)}{p_text}, {change.verdict})")
    if not ratios:
        return Measurement(reason=f"no device has successful runs with {column} for both "
                                  f"{describe(claim.measure.a)} and {describe(claim.measure.b)}")
    value = statistics.median(ratios)
    return Measurement(value=value, text=f"{value:.3f} (B/A)", evidence=run_ids(a, b),
                       detail="; ".join(details))
