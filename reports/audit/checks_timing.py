"""Timing claims: a config's median timing, or the ratio of two configs' medians (B / A).

For ratios, each device gives its own ratio, with a Mann-Whitney U test over the runs; the
claim is judged on the median of the per-device ratios. Emulated devices are excluded by the
fairness rules before this check sees the runs (their timings are the emulator's, not the
hardware's).
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


def time(claim: Claim, runs: pd.DataFrame) -> Measurement:
    """The median of a timing over the selected runs (ms), per device; judged on the median."""
    column = claim.measure.field
    a = ok_runs(select(runs, claim.measure.a))
    a = a[a[column].notna()]
    if a.empty:
        return Measurement(reason=f"no successful runs with {column} for "
                                  f"{describe(claim.measure.a)}")
    medians = {device: float(cell[column].median()) for device, cell in a.groupby("device")}
    value = statistics.median(medians.values())
    return Measurement(value=value, text=f"{value:.4g} ms", evidence=run_ids(a),
                       detail="; ".join(f"{d}: {m:.4g} ms" for d, m in sorted(medians.items())))
