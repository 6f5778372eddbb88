"""The report's tables, from an experiment's runs flattened by ``reports.runs``.

Each ``*_table`` function groups the runs into cells (``reports.cells``) and summarises them;
each is sorted on its key columns so that the same database always gives the same rows in the
same order. Statistics (median/min/max/CV) come from ``reports.stats``.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import numpy as np
import pandas as pd

from devices.conditions import memory_controllers
from reports import metrics
from reports.cells import cell_rows, group_cells, merge_flags, sorted_table
from reports.cpu import mixed_cpu_flag
from reports.runs import int_or_none, revision_label
from reports.stats import CV_FLAG, median, series_mean, summarize

# Per-run timings summarised over repeats: those a comparison follows, and the harness's own
# overhead. engine_ms (the whole engine process) is the timing of ppl runs; for generate runs
# it includes loading the model, so it is only flagged for ppl.
TIMINGS = (*metrics.TIMINGS, "overhead_ms")
CELL_KEYS = ["device", "command", "kind", "ctx", "depth", "seed", "length", "config"]


def _summary_columns(prefix: str, values: list[Any]) -> dict[str, Any]:
    summary = summarize(values)
    if summary is None:
        return {f"{prefix}_median": None, f"{prefix}_min": None, f"{prefix}_max": None,
                f"{prefix}_cv": None}
    return {f"{prefix}_median": summary.median, f"{prefix}_min": summary.min,
            f"{prefix}_max": summary.max, f"{prefix}_cv": summary.cv}


def _lists(frame: pd.DataFrame, columns: tuple[str, ...]) -> dict[str, list[Any]]:
    """Columns as lists: a cell's values are read from them by its rows' positions
    (``reports.cells.cell_rows``), without a frame per cell."""
    return {column: frame[column].tolist() for column in columns}


def _take(values: list[Any], rows: list[int]) -> list[Any]:
    return [values[i] for i in rows]


def timing_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Every timing per cell (one prompt × config × device) as median/min/max/CV over repeats."""
    rows = []
    columns = _lists(runs, ("status", "flags", "cpu", *TIMINGS))
    status = columns["status"]
    for key, cell in cell_rows(runs, CELL_KEYS):
        cell = cell.tolist()
        ok = [i for i in cell if status[i] == "ok"]
        row: dict[str, Any] = dict(zip(CELL_KEYS, key, strict=True))
        row["runs_ok"] = len(ok)
        row["runs_failed"] = len(cell) - len(ok)
        for column in TIMINGS:
            row |= _summary_columns(column.removesuffix("_per_token"),
                                    _take(columns[column], ok))
        flags = [merge_flags(_take(columns["flags"], cell)),
                 mixed_cpu_flag(_take(columns["cpu"], cell))]
        # The harness's own overhead is not a measurement of the engine: never flagged.
        unflagged = {"overhead_ms"} | ({"engine_ms"} if row["kind"] != "ppl" else set())
        noisy = [c.removesuffix("_per_token") for c in TIMINGS if c not in unflagged
                 and (row[f"{c.removesuffix('_per_token')}_cv"] or 0) > CV_FLAG]
        if noisy:
            flags.append("CV > 5 %: " + ", ".join(noisy))
        row["flags"] = "; ".join(f for f in flags if f)
        rows.append(row)
    columns = CELL_KEYS + ["runs_ok", "runs_failed"]
    return sorted_table(pd.DataFrame(rows, columns=None if rows else columns), CELL_KEYS)


def needle_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Recall per (device, config, context, depth): the mean over seeds and repeats."""
    keys = ["device", "config", "policy", "k", "ctx", "depth"]
    needle = runs[(runs["kind"] == "needle") & (runs["status"] == "ok")]
    recall = needle["recall"]
    values = recall.to_numpy()
    numeric = values.dtype == np.float64

    def mean(part: np.ndarray) -> Any:  # Series.mean(), without a Series per cell
        if numeric and len(part) == 1:  # its sum starts at 0.0
            return math.nan if math.isnan(part[0]) else 0.0 + float(part[0])
        return series_mean(part) if numeric else pd.Series(part, dtype=recall.dtype).mean()

    rows = [dict(zip(keys, key, strict=True)) | {"recall": mean(values[cell]),
                                                 "n": int((~pd.isna(values[cell])).sum())}
            for key, cell in cell_rows(needle, keys)]
    return sorted_table(pd.DataFrame(rows, columns=keys + ["recall", "n"]), keys)


def k_sweep_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (device, revision, kind, size, policy, k): recall, perplexity and timings (medians,
    with the timings' min and max over the runs) against k.

    ``size`` is the context length (needle, decode, attn-bench) or the text length (ppl). Exact
    rows have no k: they are the reference line. ``revision`` is empty unless the runs hold
    several engine revisions, which are never pooled.
    """
    ok = runs[(runs["status"] == "ok") & runs["kv_budget"].isna()].copy()  # eviction: k unused
    ok["size"] = ok["ctx"].where(ok["ctx"].notna(), ok["length"])
    several = ok["revision"].nunique() > 1 if "revision" in ok else False
    ok["revision"] = [revision_label(r) if several and isinstance(r, str) else ""
                      for r in (ok["revision"] if "revision" in ok else [None] * len(ok))]
    keys = ["device", "revision", "kind", "size", "policy", "k"]
    rows = []
    for key, cell in group_cells(ok, keys):
        # generate runs time attention per decode step; attn-bench times it alone
        attn = (cell["attn_ms_per_token"] if cell["attn_ms_per_token"].notna().any()
                else cell["attn_median_ms"])
        rows.append(dict(zip(keys, key, strict=True)) | {
            "recall": cell["recall"].mean() if cell["recall"].notna().any() else None,
            "same_as_exact": (pd.to_numeric(cell["same_as_exact"]).mean()
                              if cell["same_as_exact"].notna().any() else None),
            "ppl": cell["ppl"].median() if cell["ppl"].notna().any() else None,
            "decode_ms": cell["decode_ms_per_token"].median(),
            "decode_min": cell["decode_ms_per_token"].min(),
            "decode_max": cell["decode_ms_per_token"].max(),
            "attn_ms": attn.median(), "attn_min": attn.min(), "attn_max": attn.max(),
            "n": len(cell),
        })
    columns = keys + ["recall", "same_as_exact", "ppl", "ppl_vs_exact_pct", "decode_ms",
                      "decode_min", "decode_max", "attn_ms", "attn_min", "attn_max", "n"]
    table = pd.DataFrame(rows, columns=columns)
    # The perplexity cost of each config, (ppl / ppl(exact) - 1) x 100, on the same texts.
    for _, cell in group_cells(table, ["device", "revision", "kind", "size"]):
        exact = cell[(cell["policy"] == "exact") & cell["ppl"].notna()]["ppl"]
        if not exact.empty:
            table.loc[cell.index, "ppl_vs_exact_pct"] = (
                pd.to_numeric(cell["ppl"]) / float(exact.iloc[0]) - 1.0) * 100.0
    return sorted_table(table, keys)


def critical_k_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """Per (device, context, policy): the smallest k whose recall matches exact's.

    "Matches" means recall >= exact recall for that k and for every larger k measured, so a lucky
    small k followed by failures does not count as the boundary.
    """
    needle = sweep[sweep["kind"] == "needle"]
    rows = []
    for (device, revision, size), cell in group_cells(needle, ["device", "revision", "size"]):
        exact = cell[cell["policy"] == "exact"]["recall"]
        if exact.empty or exact.isna().all():
            continue
        reference = float(exact.iloc[0])
        for policy, group in group_cells(cell[cell["policy"] != "exact"], ["policy"]):
            group = group.dropna(subset=["k"]).sort_values("k")
            rows.append({"device": device, "revision": revision, "ctx": size,
                         "policy": policy[0],
                         "exact_recall": reference,
                         "critical_k": _critical_k(group["k"].tolist(),
                                                   group["recall"].tolist(), reference),
                         "ks_measured": " ".join(str(int(k)) for k in group["k"])})
    columns = ["device", "revision", "ctx", "policy", "exact_recall", "critical_k",
               "ks_measured"]
    return sorted_table(pd.DataFrame(rows, columns=columns),
                        ["device", "revision", "ctx", "policy"])


def _critical_k(ks: list[float], recalls: list[float], reference: float) -> int | None:
    """Walking down from the largest k, the last k whose recall still matches the reference.

    None when exact itself never recalls (every k would "match": there is no boundary)."""
    if reference <= 0:
        return None
    critical = None
    for k, recall in zip(reversed(ks), reversed(recalls), strict=True):
        if recall is None or math.isnan(recall) or recall < reference - 1e-9:
            break
        critical = int(k)
    return critical


def latency_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Decode time per token split into attention and the rest, against context length."""
    gen = runs[(runs["command"] == "generate") & (runs["status"] == "ok")]
    keys = ["device", "config", "ctx"]
    rows = []
    columns = _lists(gen, ("decode_ms_per_token", "attn_ms_per_token", "flags"))
    rests = (gen["decode_ms_per_token"] - gen["attn_ms_per_token"]).tolist()
    for key, cell in cell_rows(gen, keys):
        cell = cell.tolist()
        decode = summarize(_take(columns["decode_ms_per_token"], cell))
        attn = summarize(_take(columns["attn_ms_per_token"], cell))
        rest = summarize(_take(rests, cell))
        rows.append(dict(zip(keys, key, strict=True)) | {
            "decode_ms": decode.median if decode else None,
            "decode_min": decode.min if decode else None,
            "decode_max": decode.max if decode else None,
            "decode_cv": decode.cv if decode else None,
            "attn_ms": attn.median if attn else None,
            "rest_ms": rest.median if rest else None,
            "n": len(cell), "flags": merge_flags(_take(columns["flags"], cell)),
        })
    names = keys + ["decode_ms", "decode_min", "decode_max", "decode_cv", "attn_ms", "rest_ms",
                    "n", "flags"]
    return sorted_table(pd.DataFrame(rows, columns=names), keys)


TTFT_KEYS = ["device", "ctx", "config"]
# stored column -> (shown column, its divisor to MB)
MEMORY_COLUMNS = {"peak_rss_kb": ("peak_rss_mb", 1e3), "kv_resident_bytes": ("kv_resident_mb", 1e6),
                  "kv_allocated_bytes": ("kv_allocated_mb", 1e6)}


def ttft_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Time to first token (the prompt's prefill, ``prefill_ms``) per (device, prompt length,
    config): median [min, max] over runs, ``vs_exact`` = exact prefill's median / this one's (the
    same device, length and thread count; > 1 is faster), and the memory medians (MB) where the
    engine printed them (peak RSS, KV bytes touched, KV bytes reserved)."""
    timed = runs[(runs["status"] == "ok") & runs["prefill_ms"].notna()
                 & (runs["kind"] != "ppl")].copy()
    timed["ctx"] = timed["ctx"].where(timed["ctx"].notna(), timed["prompt_tokens"])
    rows = []
    lists = _lists(timed, ("prefill_ms", "policy", "prefill_attn", "threads", "flags"))
    memory = {stored: pd.to_numeric(timed[stored]).tolist() for stored in MEMORY_COLUMNS
              if stored in timed}
    for key, cell in cell_rows(timed, TTFT_KEYS):
        cell = cell.tolist()
        ttft = summarize(_take(lists["prefill_ms"], cell))
        first = cell[0]
        row = dict(zip(TTFT_KEYS, key, strict=True)) | {
            "policy": lists["policy"][first], "prefill_attn": lists["prefill_attn"][first],
            "threads": int_or_none(lists["threads"][first]),
            "ttft_ms": ttft.median, "ttft_min_ms": ttft.min, "ttft_max_ms": ttft.max,
            "vs_exact": None, "n": ttft.n}
        for stored, (shown, scale) in MEMORY_COLUMNS.items():
            values = [v for v in _take(memory[stored], cell) if v is not None and v == v] \
                if stored in memory else []
            row[shown] = median(values) / scale if values else None
        row["flags"] = merge_flags(_take(lists["flags"], cell))
        rows.append(row)
    columns = TTFT_KEYS + ["policy", "prefill_attn", "threads", "ttft_ms",
                           "ttft_min_ms", "ttft_max_ms", "vs_exact", "n",
                           *(shown for shown, _ in MEMORY_COLUMNS.values()), "flags"]
    table = pd.DataFrame(rows, columns=columns)
    exact = table[(table["policy"] == "exact") & (table["prefill_attn"] == "exact")]
    reference = {(r.device, r.ctx, r.threads): r.ttft_ms for r in exact.itertuples()}
    table["vs_exact"] = [None if (ref := reference.get((r.device, r.ctx, r.threads))) is None
                         else ref / r.ttft_ms for r in table.itertuples()]
    return sorted_table(table, TTFT_KEYS)


def selection_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Selection quality per (policy, k, context, device): mass captured, oracle block recall."""
    measured = runs[(runs["status"] == "ok") & runs["selection_mass"].notna()]
    keys = ["device", "policy", "k", "ctx"]
    rows = [dict(zip(keys, key, strict=True)) | {
        "mass": cell["selection_mass"].mean(),
        "oracle_recall": cell["oracle_recall"].mean(),
        "max_abs_diff": cell["max_abs_diff"].max(),
        "bytes_read": cell["bytes_read"].median(),
        "n": len(cell)} for key, cell in group_cells(measured, keys)]
    columns = keys + ["mass", "oracle_recall", "max_abs_diff", "bytes_read", "n"]
    return sorted_table(pd.DataFrame(rows, columns=columns), keys)


def failures_table(runs: pd.DataFrame) -> pd.DataFrame:
    bad = runs[runs["status"] != "ok"]
    rows = [{"run_id": int(run_id), "device": device, "kind": kind, "config": config,
             "status": status, "exit_code": int_or_none(exit_code), "error": _last_line(error)}
            for run_id, device, kind, config, status, exit_code, error in zip(
                *(bad[c].tolist() for c in ("run_id", "device", "kind", "config", "status",
                                            "exit_code", "error")), strict=True)]
    columns = ["run_id", "device", "kind", "config", "status", "exit_code", "error"]
    return sorted_table(pd.DataFrame(rows, columns=columns), ["run_id"])


def _last_line(text: Any) -> str:
    """The last line of an error text (the engine's one-line message), cut to 200 characters."""
    lines = str(text or "").strip().splitlines()
    return lines[-1][:200] if lines else ""


def builds_table(runs: pd.DataFrame) -> pd.DataFrame:
    columns = ["build_target", "build_isa", "build_revision", "build_source_hash",
               "build_compiler_version", "build_cflags", "build_binary_sha256"]
    present = runs.dropna(subset=["build_binary_sha256"])
    table = present[columns].drop_duplicates()
    table.columns = [c.removeprefix("build_") for c in columns]
    return sorted_table(table, ["target", "binary_sha256"])


def devices_table(runs: pd.DataFrame, fingerprints: dict[str, Any]) -> pd.DataFrame:
    """Devices with their fingerprint facts (``fingerprints``: device -> the document of its
    first snapshot, reports.runs.ExperimentData.device_fingerprints)."""
    rows = []
    for device, cell in group_cells(runs, ["device"]):
        row = cell.iloc[0]
        fingerprint = fingerprints.get(device[0]) or {}
        rows.append({
            "device": device[0], "arch": row["device_arch"], "class": row["device_class"],
            "emulated": bool(row["emulated"]),
            "cpu": " | ".join(dict.fromkeys(c for c in cell["cpu"] if c)),
            "kernel": str(fingerprint.get("kernel") or ""),
            "memory_clock": _memory_clock(fingerprint),
            "fingerprint_sha256": _fingerprint_hash(fingerprint),
            "runs": len(cell),
            "flags": "; ".join(f for f in (merge_flags(cell["flags"]), mixed_cpu_flag(cell["cpu"]))
                               if f),
        })
    columns = ["device", "arch", "class", "emulated", "cpu", "kernel", "memory_clock",
               "fingerprint_sha256", "runs", "flags"]
    return sorted_table(pd.DataFrame(rows, columns=columns), ["device"])


def _memory_clock(fingerprint: dict) -> str:
    """Each memory controller's clock against the highest it offers, e.g. "dmc 528/2112 MHz
    (dmc_ondemand)": the first thing to check when a board's tok/s look too low or too high."""
    parts = []
    for dev in memory_controllers(fingerprint):
        offered = [f for f in dev.get("available_hz") or [] if isinstance(f, int | float)]
        top, cur = max(offered) if offered else dev.get("max_hz"), dev.get("cur_hz")
        if isinstance(cur, int | float) and isinstance(top, int | float):
            parts.append(f"{dev.get('device')} {cur / 1e6:.0f}/{top / 1e6:.0f} MHz "
                         f"({dev.get('governor') or 'no governor'})")
    return "; ".join(parts)


def _fingerprint_hash(fingerprint: dict) -> str:
    if not fingerprint:
        return ""
    stable = {k: v for k, v in fingerprint.items() if k in STABLE_FINGERPRINT_KEYS}
    text = json.dumps(stable or fingerprint, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# Fingerprint keys that describe the machine rather than its momentary state.
STABLE_FINGERPRINT_KEYS = ("arch", "cpu_model", "cpu", "cores", "kernel", "memory_total",
                           "max_freq_khz", "core_layout", "cpus")
