"""The sections that answer an experiment's question when it compares engines or devices: each
engine against lmc, each device against the first real one, a summary first (reports.compare)
and config by config after it. A report leads with them."""

from __future__ import annotations

from reports.compare import compare_runs
from reports.runs import ExperimentData
from reports.sections import Section, Table


def device_comparison(data: ExperimentData) -> Section:
    """Every other device against a reference (the first real device): the x86-vs-ARM view."""
    ok = data.runs[data.runs["status"] == "ok"]
    devices = sorted(set(ok["device"]))
    real = [d for d in devices if not ok[ok["device"] == d]["emulated"].any()]
    tables = []
    if len(devices) >= 2:
        reference = (real or devices)[0]
        for metric in ("decode_ms_per_token", "attn_median_ms"):
            if ok[metric].notna().sum() == 0:
                continue
            for other in (d for d in devices if d != reference):
                result = compare_runs(data.runs, reference, other, metric)
                tables += [Table(f"compare_{metric}_{other}_summary", result.rollups(),
                                 caption=result.summary()),
                           Table(f"compare_{metric}_{other}", result.table)]
        text = (f"Each device against {reference}: first the summary (geometric mean of the "
                "ratios B/A with a bootstrap CI, per policy, weight format and device pair), "
                "then config by config: medians, ratio B/A, Mann-Whitney U over the repeats "
                "(independent runs) with a noise threshold (raised to the A/A noise floor of "
                "the reference), and whether the generated tokens are identical.")
    else:
        text = ""
    return Section("devices", "Devices compared", text, tables=tables)


def engine_comparison(data: ExperimentData) -> Section:
    """Every other engine against the one with attention policies (its exact attention: what
    other engines compute), on the same boards, workloads and weight formats: the
    lmc-vs-llama.cpp view."""
    ok = data.runs[data.runs["status"] == "ok"]
    engines = sorted(set(ok["engine"].dropna()))
    tables = []
    if len(engines) < 2:
        return Section("engines", "Engines compared", "", tables=tables)
    with_policies = sorted(set(ok[ok["policy"].notna()]["engine"].dropna()))
    reference = (with_policies or engines)[0]
    for metric in ("decode_ms_per_token", "prefill_ms"):
        for other in (e for e in engines if e != reference):
            if ok[ok["engine"] == other][metric].notna().sum() == 0:
                continue
            result = compare_runs(data.runs, reference, other, metric)
            tables += [Table(f"engines_{metric}_{other}_summary", result.rollups(),
                             caption=result.summary()),
                       Table(f"engines_{metric}_{other}", result.table)]
    text = (f"Each engine against {reference} (its exact attention) on the same board, "
            "workload, weight format and threads: the summary first, then config by config, "
            "Mann-Whitney U over the repeats.")
    return Section("engines", "Engines compared", text if tables else "", tables=tables)
