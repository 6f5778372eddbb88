"""Timing claims: a config's median timing, or the ratio of two configs' medians (B / A).

For ratios, each device gives its own ratio, with a Mann-Whitney U test over the runs; the
claim is judged on the median of the per-device ratios. The noise comes from the runs of a and
b paired by input and repeat (run interleaved, so a pair shares the machine's state): the 95 %
interval of the mean log ratio, as a ratio (the widest over devices). Emulated devices are
excluded by the fairness rules before this check sees the runs (their timings are the
emulator's, not the hardware's). Byte counts (select_bytes, kv_bytes, bytes_read) are read from
lmc's own "selection" figures when they are not columns of the runs.
"""

from __future__ import annotations

import json
import math
import statistics

import pandas as pd

from reports.audit.claim import Claim
from reports.audit.evidence import (
    Reading,
    Units,
    describe,
    ok_runs,
    paired_margin,
    pairs,
    run_ids,
    select,
)
from reports.stats import compare_samples

# exact attention's KV bytes per KV head: lmc counts kv_bytes per query head (each head reads
# its rows) and the probes' select_bytes once per KV head (a GQA group probes together), so a
# ratio of the two is taken in the same units, per KV head
PER_KV_HEAD = "kv_bytes_per_kv_head"


def with_field(runs: pd.DataFrame, column: str) -> pd.DataFrame:
    """The runs with ``column``; lmc's selection byte counts come from its own document."""
    if column in runs and runs[column].notna().any():
        return runs
    if column == PER_KV_HEAD:
        runs = with_field(runs, "kv_bytes")
        group = (pd.to_numeric(runs["heads"], errors="coerce")
                 / pd.to_numeric(runs["kv_heads"], errors="coerce"))
        return runs.assign(**{PER_KV_HEAD: runs["kv_bytes"] / group})
    def figure(raw: object) -> float | None:
        try:
            return float(json.loads(str(raw))["selection"][column])
        except (ValueError, KeyError, TypeError):
            return None
    return runs.assign(**{column: [figure(raw) for raw in runs["raw_json"]]})


def time_ratio(claim: Claim, runs: pd.DataFrame) -> Reading:
    """B / A of one timing (or byte count), or of b's ``field_b`` over a's ``field``."""
    column = claim.measure.field
    a = with_field(ok_runs(select(runs, claim.measure.a)), column)
    b = ok_runs(select(runs, claim.measure.b))
    if claim.measure.field_b:
        b = with_field(b, claim.measure.field_b).drop(columns=[column], errors="ignore")
        b = b.rename(columns={claim.measure.field_b: column})
    b = with_field(b, column)
    a, b = a[a[column].notna()], b[b[column].notna()]
    ratios, details, noises, paired = [], [], [], 0
    for device in sorted(set(a["device"]) & set(b["device"])):
        sample_a = a[a["device"] == device][column].tolist()
        sample_b = b[b["device"] == device][column].tolist()
        change = compare_samples(sample_a, sample_b)
        if change.ratio is None:
            continue
        ratios.append(change.ratio)
        logs = [math.log(y / x) for x, y in pairs(a[a["device"] == device],
                                                  b[b["device"] == device], column) if x > 0 < y]
        paired += len(logs)
        margin = paired_margin(logs)
        noises.append(None if margin is None else change.ratio * math.expm1(margin))
        p_text = "" if change.p_value is None else f", p={change.p_value:.2g}"
        details.append(f"{device}: {column} {statistics.median(sample_b):.4g} / "
                       f"{statistics.median(sample_a):.4g} = {change.ratio:.3f} "
                       f"(n={len(sample_a)}/{len(sample_b)}{p_text}, {change.verdict})")
    if not ratios:
        return Reading(reason=f"no device has successful runs with {column} for both "
                              f"{describe(claim.measure.a)} and {describe(claim.measure.b)}")
    value = statistics.median(ratios)
    noise = None if None in noises else max(noises)
    return Reading(value=value, text=f"{value:.3f} (B/A)", evidence=run_ids(a, b),
                   detail="; ".join(details) + ("; no runs paired by input and repeat"
                                                if noise is None else ""), noise=noise,
                   units=Units(paired, f"{paired} pairs of runs (by input and repeat; a timing "
                                       "varies run to run, so each pair is a unit of its noise)"))


def time(claim: Claim, runs: pd.DataFrame) -> Reading:
    """The median of a timing over the selected runs (ms), per device; judged on the median."""
    column = claim.measure.field
    a = ok_runs(select(runs, claim.measure.a))
    a = a[a[column].notna()]
    if a.empty:
        return Reading(reason=f"no successful runs with {column} for "
                              f"{describe(claim.measure.a)}")
    medians = {device: float(cell[column].median()) for device, cell in a.groupby("device")}
    value = statistics.median(medians.values())
    margins = [paired_margin(cell[column].tolist()) for _, cell in a.groupby("device")]
    return Reading(value=value, text=f"{value:.4g} ms", evidence=run_ids(a),
                   noise=None if None in margins else max(margins),
                   units=Units(len(a), f"{len(a)} runs (a timing varies run to run)"),
                   detail="; ".join(f"{d}: {m:.4g} ms" for d, m in sorted(medians.items())))
