"""From the raw rows of an experiment to the tables of a report (pandas).

``load_experiment`` flattens the store's frames into one row per run (config, device, build,
workload parameters, outcome, flags). The ``*_table`` functions turn that into the report's
tables; each is sorted on its key columns so that the same database always gives the same rows
in the same order. Statistics (median/min/max/CV) come from ``reports.stats``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from sqlalchemy import select

from db.models import Experiment
from devices.flags import memory_controllers, run_flags
from reports.cpu import mixed_cpu_flag, run_cpu
from reports.stats import CV_FLAG, summarize

# Workload parameters lifted into columns (whichever the workload kind has).
PARAM_COLUMNS = ("ctx", "depth", "seed", "length", "heads", "kv_heads", "head_dim")
# Engine defaults that config labels leave out (the label names only what differs).
# A run's config holds an engine switch only when the spec set it away from the default.
SWITCH_LABELS = {"importance": "no-importance", "recency": "no-recency",
                 "probe_summary": "probe-summary", "ref_attn": "ref-attn"}
LABEL_DEFAULTS = {"block": 32, "probes": 8, "kv": "f32", "wq": "f32", "prefill_attn": "exact"}
# Per-run timings summarised over repeats. engine_ms (the whole engine process) is the timing
# of ppl runs; for generate runs it includes loading the model, so it is only flagged for ppl.
TIMINGS = ("decode_ms_per_token", "attn_ms_per_token", "prefill_ms", "attn_median_ms",
           "engine_ms", "overhead_ms")
# lmc --measure-keys: seed 004's figures of a policy's key ranking (engine/keyrank.h)
RANK_METRICS = ("rho", "recall32", "captured32", "lost50")
CELL_KEYS = ["device", "command", "kind", "ctx", "depth", "seed", "length", "config"]


@dataclass
class ExperimentData:
    name: str
    spec_text: str
    spec_hash: str
    runs: pd.DataFrame  # one row per run, every column flattened (see load_experiment)
    steps: pd.DataFrame  # token_timings rows: run_id, step, token, ms, attn_ms
    snapshots: pd.DataFrame  # device_snapshots rows with the fingerprint JSON text


def _json(text: Any) -> Any:
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return None
    return json.loads(text) if isinstance(text, str) else text


def _int_or_none(value: Any) -> int | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value)


def generated_tokens(value: Any) -> list[int] | None:
    """The generated ids of a run (stored as JSON text), or None when it generated nothing."""
    value = _json(value)
    return None if value is None else [int(t) for t in value]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first step where two generations differ (None when identical)."""
    for step, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return step
    return None if len(a) == len(b) else min(len(a), len(b))


def config_label(row: pd.Series | dict[str, Any]) -> str:
    """A short, stable name of an engine config: ``exact``, ``sparse k=32``, ``h2o k=8 kv=q8``."""
    get = row.get
    policy = get("policy") or "exact"
    engine = get("engine")
    # another engine's runs have no attention policy: its name leads the label instead
    parts = [str(engine) if isinstance(engine, str) and engine != "lmc" else str(policy)]
    k = _int_or_none(get("k"))
    config = _json(get("config"))
    evicting = isinstance(config, dict) and config.get("kv_budget") is not None
    if policy != "exact" and k is not None and not evicting:  # eviction does not use k
        parts.append(f"k={k}")
    for name, default in LABEL_DEFAULTS.items():
        value = get(name)
        if isinstance(value, float):
            value = _int_or_none(value)
        if value is not None and value != default and not (policy == "exact" and
                                                           name in ("block", "probes")):
            parts.append(f"{name}={value}")
    if isinstance(config, dict):  # engine switches away from their defaults (spec axes)
        parts += [label for name, label in SWITCH_LABELS.items()
                  if config.get(name) is not None]
        if config.get("kv_budget") is not None:  # eviction for good (lmc --kv-budget)
            parts.append(f"kv-budget={config['kv_budget']}")
        if config.get("predictor"):  # gbm's trees, by the start of their sha256
            parts.append(f"trees={str(config['predictor'])[:8]}")
    threads = _int_or_none(get("threads"))
    if threads is not None:
        parts.append(f"t={threads}")
    return " ".join(parts)


def _text_label(params: dict[str, Any]) -> str:
    """A workload's own filler or needle (spec settings), so that its runs form cells apart."""
    parts = [f"filler={Path(params['filler']).name}"] if params.get("filler") else []
    if params.get("needle") or params.get("question"):
        parts.append("own-needle")
    return "".join(" " + part for part in parts)


def load_experiment(store: Any, experiment: str) -> ExperimentData:
    """Read an experiment's rows and flatten them into one DataFrame row per run."""
    frames = store.frames(experiment)
    with store.session() as session:
        exp = session.scalar(select(Experiment).where(Experiment.name == experiment))
        spec_text, spec_hash = exp.spec_text, exp.spec_hash
    return ExperimentData(
        name=experiment, spec_text=spec_text, spec_hash=spec_hash,
        runs=flatten_runs(frames["runs"], frames["outcomes"], frames["snapshots"]),
        steps=frames["token_timings"], snapshots=frames["snapshots"])


def flatten_runs(runs: pd.DataFrame, outcomes: pd.DataFrame,
                 snapshots: pd.DataFrame) -> pd.DataFrame:
    """One row per run: run columns, outcome columns, workload parameters, label and flags."""
    table = runs.rename(columns={"id": "run_id"}).copy()
    if len(outcomes):
        table = table.merge(outcomes, on="run_id", how="left", suffixes=("", "_outcome"))
    else:
        for column in outcomes.columns:
            if column != "run_id":
                table[column] = None
    table["device"] = table["device_name"]
    table["device_class"] = table["device_cls"]
    table["emulated"] = table["device_emulated"].astype(bool)
    table["kind"] = table["workload_kind"].where(table["workload_kind"].notna(), table["command"])
    params = [(_json(p) or {}) for p in table["workload_params"]]
    raws = [(_json(r) or {}) if isinstance(r, str) and r.startswith("{") else {}
            for r in table["raw_json"]]
    for column in PARAM_COLUMNS:
        values = []
        for param, raw in zip(params, raws, strict=True):
            value = param.get(column)
            if value is None and column == "ctx":  # attn-bench without a workload row
                value = raw.get("ctx")
            values.append(value)
        table[column] = pd.Series(values, index=table.index, dtype="object")
    _engine_columns(table)
    table["config"] = [config_label(row) + _text_label(param)
                       for (_, row), param in zip(table.iterrows(), params, strict=True)]
    by_run = snapshots_by_run(snapshots)
    table["flags"] = _run_flags(table, by_run)
    table["cpu"] = [run_cpu(by_run.get(int(run_id), {})) for run_id in table["run_id"]]
    table["same_as_exact"] = same_as_exact(table)
    return table.sort_values("run_id", kind="mergesort").reset_index(drop=True)


def _engine_columns(table: pd.DataFrame) -> None:
    """Columns from a run's stored config and outcome figures: ``kv_budget`` (eviction), and
    ``rank_<metric>`` (lmc --measure-keys: RANK_METRICS of the policy's key ranking, all layers)."""
    configs = [_json(c) for c in table["config"]]
    table["kv_budget"] = pd.Series([c.get("kv_budget") if isinstance(c, dict) else None
                                    for c in configs], index=table.index, dtype="object")
    extras = [_json(e) for e in table["extra"]] if "extra" in table else [None] * len(table)
    rankings = [e.get("key_ranking") or {} if isinstance(e, dict) else {} for e in extras]
    for name in RANK_METRICS:
        table[f"rank_{name}"] = pd.Series([r.get(name) for r in rankings], index=table.index,
                                          dtype="float64")


PROMPT_KEYS = ["device", "kind", "ctx", "depth", "seed", "length", "repeat", "threads"]


def same_as_exact(table: pd.DataFrame) -> pd.Series:
    """Per generate run: 1.0 when its tokens equal exact attention's on the same prompt, device,
    repeat and thread count, 0.0 when they differ, None when there is no exact run to compare."""
    exact: dict[tuple, list[int]] = {}
    for _, row in table.iterrows():
        ids = generated_tokens(row.get("generated_ids"))
        if row["policy"] == "exact" and row["status"] == "ok" and ids is not None:
            exact[_key(row)] = ids
    values = []
    for _, row in table.iterrows():
        ids = generated_tokens(row.get("generated_ids"))
        reference = exact.get(_key(row))
        values.append(None if ids is None or reference is None or row["status"] != "ok"
                      else float(ids == reference))
    return pd.Series(values, index=table.index, dtype="object")


def plain_key(values: Any) -> tuple:
    """A key with NaN as None, so that equal keys compare equal (NaN != NaN)."""
    return tuple(None if isinstance(v, float) and math.isnan(v) else v for v in values)


def _key(row: pd.Series) -> tuple:
    return plain_key(row.get(k) for k in PROMPT_KEYS)


def snapshots_by_run(snapshots: pd.DataFrame) -> dict[int, dict[str, dict]]:
    """run id -> phase ("before", "after") -> the fingerprint document."""
    by_run: dict[int, dict[str, dict]] = {}
    for _, snap in snapshots.iterrows():
        by_run.setdefault(int(snap["run_id"]), {})[snap["phase"]] = _json(snap["fingerprint"])
    return by_run


def _run_flags(table: pd.DataFrame, by_run: dict[int, dict[str, dict]]) -> list[str]:
    flags = []
    for _, row in table.iterrows():
        found: list[str] = []
        if row["emulated"]:
            found.append("emulated")
        if row["status"] != "ok":
            found.append(str(row["status"]))
        phases = by_run.get(int(row["run_id"]), {})
        found += run_flags(phases.get("before"), phases.get("after"))
        flags.append("; ".join(dict.fromkeys(found)))
    return flags


def sorted_table(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return frame.sort_values(keys, kind="mergesort", na_position="first",
                             key=_sort_key).reset_index(drop=True)


def natural_key(text: Any) -> tuple:
    """Text with its digit runs compared as numbers: "sparse k=4" before "sparse k=32"."""
    parts = re.split(r"(\d+)", str(text))
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def _sort_key(column: pd.Series) -> pd.Series:
    """Numbers sort as numbers, text naturally (digit runs as numbers); None first."""
    if pd.api.types.is_numeric_dtype(column):
        return column
    numeric = pd.to_numeric(column, errors="coerce")
    if numeric.notna().sum() == column.notna().sum():
        return numeric
    return column.map(natural_key)


def group_cells(frame: pd.DataFrame, keys: list[str]):
    """groupby that keeps None keys (pandas drops them by default) in a stable order."""
    return frame.groupby(keys, dropna=False, sort=True)


def merge_flags(values: pd.Series) -> str:
    seen: dict[str, None] = {}
    for text in values:
        for flag in str(text or "").split("; "):
            if flag and flag != "ok":
                seen[flag] = None
    return "; ".join(sorted(seen))


def _summary_columns(prefix: str, values: pd.Series) -> dict[str, Any]:
    summary = summarize(values)
    if summary is None:
        return {f"{prefix}_median": None, f"{prefix}_min": None, f"{prefix}_max": None,
                f"{prefix}_cv": None}
    return {f"{prefix}_median": summary.median, f"{prefix}_min": summary.min,
            f"{prefix}_max": summary.max, f"{prefix}_cv": summary.cv}


def timing_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Every timing per cell (one prompt × config × device) as median/min/max/CV over repeats."""
    rows = []
    for key, cell in group_cells(runs, CELL_KEYS):
        ok = cell[cell["status"] == "ok"]
        row: dict[str, Any] = dict(zip(CELL_KEYS, key, strict=True))
        row["runs_ok"] = len(ok)
        row["runs_failed"] = len(cell) - len(ok)
        for column in TIMINGS:
            row |= _summary_columns(column.removesuffix("_per_token"), ok[column])
        flags = [merge_flags(cell["flags"]), mixed_cpu_flag(cell["cpu"])]
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
    rows = [dict(zip(keys, key, strict=True)) | {"recall": cell["recall"].mean(),
                                                 "n": int(cell["recall"].notna().sum())}
            for key, cell in group_cells(needle, keys)]
    return sorted_table(pd.DataFrame(rows, columns=keys + ["recall", "n"]), keys)


def k_sweep_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (device, kind, size, policy, k): recall, perplexity and timings (medians) against k.

    ``size`` is the context length (needle, decode, attn-bench) or the text length (ppl). Exact
    rows have no k: they are the reference line.
    """
    ok = runs[(runs["status"] == "ok") & runs["kv_budget"].isna()].copy()  # eviction: k unused
    ok["size"] = ok["ctx"].where(ok["ctx"].notna(), ok["length"])
    keys = ["device", "kind", "size", "policy", "k"]
    rows = []
    for key, cell in group_cells(ok, keys):
        rows.append(dict(zip(keys, key, strict=True)) | {
            "recall": cell["recall"].mean() if cell["recall"].notna().any() else None,
            "same_as_exact": (pd.to_numeric(cell["same_as_exact"]).mean()
                              if cell["same_as_exact"].notna().any() else None),
            "ppl": cell["ppl"].median() if cell["ppl"].notna().any() else None,
            "decode_ms": cell["decode_ms_per_token"].median(),
            # generate runs time attention per decode step; attn-bench times it alone
            "attn_ms": (cell["attn_ms_per_token"].median()
                        if cell["attn_ms_per_token"].notna().any()
                        else cell["attn_median_ms"].median()),
            "n": len(cell),
        })
    columns = keys + ["recall", "same_as_exact", "ppl", "ppl_vs_exact_pct", "decode_ms",
                      "attn_ms", "n"]
    table = pd.DataFrame(rows, columns=columns)
    # The perplexity cost of each config, (ppl / ppl(exact) - 1) x 100, on the same texts.
    for _, cell in group_cells(table, ["device", "kind", "size"]):
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
    for (device, size), cell in group_cells(needle, ["device", "size"]):
        exact = cell[cell["policy"] == "exact"]["recall"]
        if exact.empty or exact.isna().all():
            continue
        reference = float(exact.iloc[0])
        for policy, group in group_cells(cell[cell["policy"] != "exact"], ["policy"]):
            group = group.dropna(subset=["k"]).sort_values("k")
            rows.append({"device": device, "ctx": size, "policy": policy[0],
                         "exact_recall": reference,
                         "critical_k": _critical_k(group["k"].tolist(),
                                                   group["recall"].tolist(), reference),
                         "ks_measured": " ".join(str(int(k)) for k in group["k"])})
    columns = ["device", "ctx", "policy", "exact_recall", "critical_k", "ks_measured"]
    return sorted_table(pd.DataFrame(rows, columns=columns), ["device", "ctx", "policy"])


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
    for key, cell in group_cells(gen, keys):
        decode = summarize(cell["decode_ms_per_token"])
        attn = summarize(cell["attn_ms_per_token"])
        rest = summarize(cell["decode_ms_per_token"] - cell["attn_ms_per_token"])
        rows.append(dict(zip(keys, key, strict=True)) | {
            "decode_ms": decode.median if decode else None,
            "decode_min": decode.min if decode else None,
            "decode_max": decode.max if decode else None,
            "decode_cv": decode.cv if decode else None,
            "attn_ms": attn.median if attn else None,
            "rest_ms": rest.median if rest else None,
            "n": len(cell), "flags": merge_flags(cell["flags"]),
        })
    columns = keys + ["decode_ms", "decode_min", "decode_max", "decode_cv", "attn_ms", "rest_ms",
                      "n", "flags"]
    return sorted_table(pd.DataFrame(rows, columns=columns), keys)


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
    rows = [{"run_id": int(r["run_id"]), "device": r["device"], "kind": r["kind"],
             "config": r["config"], "status": r["status"],
             "exit_code": _int_or_none(r["exit_code"]),
             "error": _last_line(r["error"])}
            for _, r in bad.iterrows()]
    columns = ["run_id", "device", "kind", "config", "status", "exit_code", "error"]
    return sorted_table(pd.DataFrame(rows, columns=columns), ["run_id"])


def _last_line(text: Any) -> str:
    """The last line of an error text (the engine's one-line message), cut to 200 characters."""
    lines = str(text or "").strip().splitlines()
    return lines[-1][:200] if lines else ""


def builds_table(runs: pd.DataFrame) -> pd.DataFrame:
    columns = ["build_target", "build_revision", "build_source_hash", "build_compiler_version",
               "build_cflags", "build_binary_sha256"]
    present = runs.dropna(subset=["build_binary_sha256"])
    table = present[columns].drop_duplicates()
    table.columns = [c.removeprefix("build_") for c in columns]
    return sorted_table(table, ["target", "binary_sha256"])


def devices_table(runs: pd.DataFrame, snapshots: pd.DataFrame) -> pd.DataFrame:
    """Devices with their fingerprint facts (from the first snapshot of each device)."""
    rows = []
    first: dict[str, dict] = {}
    by_id = {int(r["run_id"]): r["device"] for _, r in runs.iterrows()}
    for _, snap in snapshots.iterrows():
        device = by_id.get(int(snap["run_id"]))
        if device is not None and device not in first:
            first[device] = _json(snap["fingerprint"]) or {}
    for device, cell in group_cells(runs, ["device"]):
        row = cell.iloc[0]
        fingerprint = first.get(device[0], {})
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
