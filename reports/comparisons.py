"""The sections that answer an experiment's question when it compares engines or devices: each
engine against lmc, each device against the first real one, a summary first (reports.compare)
and config by config after it. A report leads with them."""

from __future__ import annotations

import pandas as pd

from reports.compare import compare_runs
from reports.runs import ExperimentData
from reports.sections import Section, Table


def _each_against(runs: pd.DataFrame, reference: str, others: list[str],
                  metrics: tuple[str, ...], prefix: str) -> list[Table]:
    """For each metric some run of the other side measured: its summary, then the rows."""
    ok = runs[runs["status"] == "ok"]
    tables = []
    for metric in metrics:
        for other in others:
            if ok[(ok["device"] == other) | (ok["engine"] == other)][metric].notna().sum() == 0:
                continue
            result = compare_runs(runs, reference, other, metric)
            tables += [Table(f"{prefix}_{metric}_{other}_summary", result.rollups(),
                             caption=result.summary()),
                       Table(f"{prefix}_{metric}_{other}", result.table)]
    return tables


def device_comparison(data: ExperimentData) -> Section:
    """Every other device against a reference (the first real device): the x86-vs-ARM view."""
    ok = data.runs[data.runs["status"] == "ok"]
    devices = sorted(set(ok["device"]))
    if len(devices) < 2:
        return Section("devices", "Devices compared", "")
    real = [d for d in devices if not ok[ok["device"] == d]["emulated"].any()]
    reference = (real or devices)[0]
    tables = _each_against(data.runs, reference, [d for d in devices if d != reference],
                           ("decode_ms_per_token", "attn_median_ms"), "compare")
    text = (f"Each device against {reference}: first the summary (geometric mean of the "
            "ratios B/A with a bootstrap CI, per policy, weight format and device pair), "
            "then config by config: medians, ratio B/A, Mann-Whitney U over the repeats "
            "(independent runs) with a noise threshold (raised to the A/A noise floor of "
            "the reference), and whether the generated tokens are identical.")
    return Section("devices", "Devices compared", text, tables=tables)


def engine_comparison(data: ExperimentData) -> Section:
    """Every other engine against the one with attention policies (its exact attention: what
    other engines compute), on the same boards, workloads and weight formats: the
    lmc-vs-llama.cpp view."""
    ok = data.runs[data.runs["status"] == "ok"]
    engines = sorted(set(ok["engine"].dropna()))
    if len(engines) < 2:
        return Section("engines", "Engines compared", "")
    reference = (sorted(set(ok[ok["policy"].notna()]["engine"].dropna())) or engines)[0]
    tables = _each_against(data.runs, reference, [e for e in engines if e != reference],
                           ("decode_ms_per_token", "prefill_ms"), "engines")
    text = (f"Each engine against {reference} (its exact attention) on the same board, "
            "workload, weight format and threads: the summary first, then config by config, "
            "Mann-Whitney U over the repeats.")
    return Section("engines", "Engines compared", text if tables else "", tables=tables)
