"""An experiment's raw rows flattened into one row per run (pandas).

``load_experiment`` reads the store's frames (each run's current measurement, or those a
``db.measurements.Selection`` names) and ``flatten_runs`` turns them into one row per
measurement: config, device, build, workload parameters, outcome, the config's label, the run's
flags (``devices.conditions``), its CPU (``reports.cpu``) and whether its tokens equal exact
attention's.
The report's tables (``reports.aggregate``), compare and the audit read that frame.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from db.lmc_axes import DEFAULTS, NAME, SWITCHES, shows_k
from db.measurements import CURRENT, Selection
from devices.conditions import run_flags
from reports.cells import plain_key
from reports.cpu import run_cpu

# Workload parameters lifted into columns (whichever the workload kind has).
PARAM_COLUMNS = ("ctx", "depth", "seed", "length", "heads", "kv_heads", "head_dim")
# lmc's defaults that config labels leave out (the label names only what differs); a run's
# config holds an engine switch only when the spec set it away from its default
LABEL_DEFAULTS = {name: DEFAULTS[name] for name in ("block", "probes", "kv", "wq",
                                                    "prefill_attn")}
# lmc --measure-keys: the eviction-prediction article's figures of a policy's key ranking
# (engine/keyrank.h)
RANK_METRICS = ("rho", "recall32", "captured32", "lost50", "lost_keep")
# and of its two-stage candidates in the last 128 keys (top-32 recall at C, mass kept at C = 96)
CANDIDATE_METRICS = ("recall32_c32", "recall32_c48", "recall32_c64", "recall32_c96",
                     "kept32_c96", "recall32_direct")  # direct: the top D of all keys


@dataclass
class ExperimentData:
    name: str
    spec_text: str
    spec_hash: str
    runs: pd.DataFrame  # one row per measurement read, every column flattened
    steps: pd.DataFrame  # token_timings rows: measurement_id, step, token, ms, attn_ms
    snapshots: pd.DataFrame  # device_snapshots rows with their summary documents
    # device -> the fingerprint document of its first snapshot among the runs
    device_fingerprints: dict[str, Any] = field(default_factory=dict)
    model_configs: dict[str, Any] = field(default_factory=dict)  # model sha256 -> config.json
    limits: dict[str, Any] = field(default_factory=dict)  # device -> its measured limits


def stored_json(text: Any) -> Any:
    """A column stored as JSON text, parsed; None for SQL NULL (None, or NaN in a frame)."""
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return None
    return json.loads(text) if isinstance(text, str) else text


def int_or_none(value: Any) -> int | None:
    """An integer column's value as an int; None for SQL NULL (None, or NaN in a frame)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value)


def parsed_json(texts: Iterable[Any]) -> list[Any]:
    """``stored_json`` of each value, each distinct text parsed once (many rows hold the same
    text: a workload's parameters, a run's tokens, a snapshot). Rows that hold the same text
    share its value: read it, never change it."""
    parsed: dict[str, Any] = {}
    out = []
    for text in texts:
        if isinstance(text, str):
            value = parsed.get(text, parsed)
            if value is parsed:
                value = parsed[text] = json.loads(text)
            out.append(value)
        else:
            out.append(stored_json(text))
    return out


def generated_tokens(value: Any) -> list[int] | None:
    """The generated ids of a run (stored as JSON text), or None when it generated nothing."""
    value = stored_json(value)
    return None if value is None else [int(t) for t in value]


def generated_tokens_of(values: Iterable[Any]) -> list[list[int] | None]:
    """``generated_tokens`` of each value, each distinct text once (shared: never change
    them)."""
    found: dict[str, list[int] | None] = {}
    out = []
    for value in values:
        if isinstance(value, str):
            if value not in found:
                found[value] = generated_tokens(value)
            out.append(found[value])
        else:
            out.append(generated_tokens(value))
    return out


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
    parts = [str(engine) if isinstance(engine, str) and engine != NAME else str(policy)]
    k = int_or_none(get("k"))
    config = stored_json(get("config"))
    kv_budget = config.get("kv_budget") if isinstance(config, dict) else None
    if shows_k(policy, k, kv_budget):
        parts.append(f"k={k}")
    for name, default in LABEL_DEFAULTS.items():
        value = get(name)
        if isinstance(value, float):
            value = int_or_none(value)
        if value is not None and value != default and not (policy == "exact" and
                                                           name in ("block", "probes")):
            parts.append(f"{name}={value}")
    if isinstance(config, dict):  # engine switches away from their defaults (spec axes)
        parts += [switch.label for switch in SWITCHES if config.get(switch.name) is not None]
        if config.get("kv_budget") is not None:  # eviction for good (lmc --kv-budget)
            parts.append(f"kv-budget={config['kv_budget']}")
        if config.get("predictor"):  # gbm's trees, by the start of their sha256
            parts.append(f"trees={str(config['predictor'])[:8]}")
        # the key ranking's budget and direct candidates (lmc --measure-keys-keep, -direct)
        if config.get("measure_keys_keep") is not None:
            parts.append(f"ranked-keep={config['measure_keys_keep']}%")
        if config.get("measure_keys_direct") is not None:
            parts.append(f"direct={config['measure_keys_direct']}")
        if config.get("bf16_acts"):  # lmc --bf16-acts
            parts.append("acts=bf16")
    threads = int_or_none(get("threads"))
    if threads is not None:
        parts.append(f"t={threads}")
    return " ".join(parts)


REVISION_PART = "rev="  # the part of a config label naming the engine revision


def revision_label(revision: str) -> str:
    """An engine revision as labels show it: the commit's first 12 characters (``+dirty``
    kept: the working tree with local changes)."""
    commit, dirty, _ = str(revision).partition("+")
    return commit[:12] + ("+dirty" if dirty else "")


def without_revision(label: str) -> str:
    """A config label without its revision part: the same engine config at every revision."""
    return " ".join(part for part in str(label).split() if not part.startswith(REVISION_PART))


def _text_label(params: dict[str, Any]) -> str:
    """A workload's own filler or needle (spec settings), so that its runs form cells apart."""
    parts = [f"filler={Path(params['filler']).name}"] if params.get("filler") else []
    if params.get("needle") or params.get("question"):
        parts.append("own-needle")
    return "".join(" " + part for part in parts)


def load_experiment(store: Any, experiment: str,
                    selection: Selection = CURRENT) -> ExperimentData:
    """Read an experiment's rows and flatten them into one DataFrame row per measurement (by
    default each run's current one: its latest ok)."""
    frames = store.frames(experiment, selection, summaries=True)
    spec = store.experiment_spec(experiment)
    runs = flatten_runs(frames["runs"], frames["outcomes"], frames["snapshots"])
    models = sorted({str(s) for s in runs.get("model_sha256", pd.Series(dtype=str)).dropna()})
    first = first_snapshots(runs, frames["snapshots"])
    documents = store.snapshot_fingerprints(first.values())
    return ExperimentData(
        name=experiment, spec_text=spec.text, spec_hash=spec.hash, runs=runs,
        steps=frames["token_timings"], snapshots=frames["snapshots"],
        device_fingerprints={device: documents.get(snapshot) or {}
                             for device, snapshot in first.items()},
        model_configs=store.model_configs(models),
        limits=store.board_limits(sorted(set(runs["device"]))) if len(runs) else {})


def flatten_runs(runs: pd.DataFrame, outcomes: pd.DataFrame,
                 snapshots: pd.DataFrame) -> pd.DataFrame:
    """One row per measurement: run and measurement columns, outcome columns, workload
    parameters, label and flags. Work per row is done on plain column lists (a nightly history
    has tens of thousands of rows); what is the same for many rows (a config's label, a
    workload's parameters) is worked out once."""
    table = runs.rename(columns={"id": "run_id"}).copy()
    if len(outcomes):
        table = table.merge(outcomes, on="measurement_id", how="left", suffixes=("", "_outcome"))
    else:
        for column in outcomes.columns:
            if column != "measurement_id":
                table[column] = None
    table["device"] = table["device_name"]
    table["device_class"] = table["device_cls"]
    table["emulated"] = table["device_emulated"].astype(bool)
    params = _point_columns(table)
    missing_ctx = [i for i, value in enumerate(table["ctx"]) if value is None]
    if missing_ctx:  # attn-bench without a workload row: the ctx its engine document names
        raws = table["raw_json"].tolist()
        ctx = table["ctx"].tolist()
        for i in missing_ctx:
            raw = raws[i]
            ctx[i] = ((stored_json(raw) or {}) if isinstance(raw, str) and raw.startswith("{")
                      else {}).get("ctx")
        table["ctx"] = pd.Series(ctx, index=table.index, dtype="object")
    configs = parsed_json(table["config"])
    _engine_columns(table, configs)
    table["config"] = _config_labels(table, configs, params)
    table["revision"] = table["build_revision"]
    # never one cell over several revisions of an engine (two engines have two revisions by
    # nature: their engine column keeps them apart)
    several = table.groupby("engine")["revision"].nunique()
    table["config"] = [f"{label} {REVISION_PART}{revision_label(rev)}"
                       if isinstance(rev, str) and several.get(engine, 0) > 1 else label
                       for label, rev, engine in zip(table["config"], table["revision"],
                                                     table["engine"], strict=True)]
    by_run = snapshots_by_run(snapshots)
    table["flags"] = _run_flags(table, by_run)
    table["cpu"] = [run_cpu(by_run.get(int(m), {})) for m in table["measurement_id"]]
    table["same_as_exact"] = same_as_exact(table)
    return table.sort_values(["run_id", "measurement_id"], kind="mergesort").reset_index(
        drop=True)


def _point_columns(table: pd.DataFrame) -> list[Any]:
    """``kind`` and the workload parameters' columns (PARAM_COLUMNS) of each row; returns the
    parameters."""
    table["kind"] = table["workload_kind"].where(table["workload_kind"].notna(), table["command"])
    params = _parsed_once(table["workload_params"])
    for column in PARAM_COLUMNS:
        table[column] = pd.Series([param.get(column) for param in params], index=table.index,
                                  dtype="object")
    return params


def labelled_for_history(table: pd.DataFrame) -> pd.DataFrame:
    """A history's rows (db.frames.history_frame) with what ``flatten_runs`` gives a row to
    label it: its kind, workload parameters and config label (without a revision part: a
    history keeps revisions apart itself)."""
    params = _point_columns(table)
    table["config"] = _config_labels(table, parsed_json(table["config"]), params)
    return table


def _parsed_once(texts: pd.Series) -> list[Any]:
    """Stored JSON texts parsed, each distinct text once (a workload's parameters are shared by
    every run of it); ``{}`` for none."""
    parsed: dict[str, Any] = {}
    out = []
    for text in texts:
        if not isinstance(text, str):  # read as a value already (or none)
            out.append(stored_json(text) or {})
            continue
        if text not in parsed:
            parsed[text] = stored_json(text) or {}
        out.append(parsed[text])
    return out


LABEL_COLUMNS = ("policy", "engine", "k", "block", "probes", "kv", "wq", "prefill_attn",
                 "threads")


def _config_labels(table: pd.DataFrame, configs: list[Any], params: list[Any]) -> list[str]:
    """Each row's config label (``config_label`` and the workload's own text), worked out once
    per distinct config: what a label reads of a row's config (the switches, the budget, the
    trees) and its axis columns."""
    read = ("kv_budget", "predictor", "bf16_acts", *(switch.name for switch in SWITCHES))
    columns = [table[c].tolist() if c in table else [None] * len(table) for c in LABEL_COLUMNS]
    labels: dict[tuple, str] = {}
    out = []
    for i, (config, param) in enumerate(zip(configs, params, strict=True)):
        axes = tuple(plain_key(column[i] for column in columns))
        chosen = tuple((name, config.get(name)) for name in read) \
            if isinstance(config, dict) else None
        text = (param.get("filler"), param.get("needle"), param.get("question"))
        key = (axes, chosen, text)
        if key not in labels:
            row = dict(zip(LABEL_COLUMNS, axes, strict=True))
            row["config"] = None if chosen is None else dict(chosen)
            labels[key] = config_label(row) + _text_label(param)
        out.append(labels[key])
    return out


def _engine_columns(table: pd.DataFrame, configs: list[Any]) -> None:
    """Columns from a run's stored config and outcome figures: ``kv_budget`` (eviction), and
    ``rank_<metric>`` (lmc --measure-keys: RANK_METRICS and CANDIDATE_METRICS of the policy's
    key ranking, all layers)."""
    table["kv_budget"] = pd.Series([c.get("kv_budget") if isinstance(c, dict) else None
                                    for c in configs], index=table.index, dtype="object")
    extras = parsed_json(table["extra"]) if "extra" in table else [None] * len(table)
    rankings = [e.get("key_ranking") or {} if isinstance(e, dict) else {} for e in extras]
    for name in RANK_METRICS + CANDIDATE_METRICS:
        table[f"rank_{name}"] = pd.Series([r.get(name) for r in rankings], index=table.index,
                                          dtype="float64")


PROMPT_KEYS = ["device", "kind", "ctx", "depth", "seed", "length", "repeat", "threads"]


def same_as_exact(table: pd.DataFrame) -> pd.Series:
    """Per generate run: 1.0 when its tokens equal exact attention's on the same prompt, device,
    repeat and thread count, 0.0 when they differ, None when there is no exact run to compare."""
    if "generated_ids" not in table:
        return pd.Series([None] * len(table), index=table.index, dtype="object")
    keys = [plain_key(values) for values in zip(
        *(table[k].tolist() if k in table else [None] * len(table) for k in PROMPT_KEYS),
        strict=True)]
    tokens = generated_tokens_of(table["generated_ids"])
    statuses, policies = table["status"].tolist(), table["policy"].tolist()
    exact: dict[tuple, list[int]] = {}
    for key, ids, status, policy in zip(keys, tokens, statuses, policies, strict=True):
        if policy == "exact" and status == "ok" and ids is not None:
            exact[key] = ids
    values = [None if ids is None or exact.get(key) is None or status != "ok"
              else float(ids == exact[key])
              for key, ids, status in zip(keys, tokens, statuses, strict=True)]
    return pd.Series(values, index=table.index, dtype="object")


def snapshots_by_run(snapshots: pd.DataFrame) -> dict[int, dict[str, dict]]:
    """measurement id -> phase ("before", "after") -> the snapshot's summary document
    (db.rows.snapshot_summary: a frame read with ``summaries``)."""
    by_run: dict[int, dict[str, dict]] = {}
    if snapshots.empty:
        return by_run
    for measurement, phase, summary in zip(snapshots["measurement_id"], snapshots["phase"],
                                           parsed_json(snapshots["summary"]), strict=True):
        by_run.setdefault(int(measurement), {})[phase] = summary
    return by_run


def first_snapshots(runs: pd.DataFrame, snapshots: pd.DataFrame) -> dict[str, int]:
    """Each device's first snapshot among the runs' (device -> snapshot id): the one whose
    whole fingerprint a report shows of the device."""
    device_of = dict(zip((int(m) for m in runs["measurement_id"]), runs["device"].tolist(),
                         strict=True))
    first: dict[str, int] = {}
    if snapshots.empty:
        return first
    for measurement, snapshot in zip(snapshots["measurement_id"], snapshots["id"], strict=True):
        device = device_of.get(int(measurement))
        if device is not None and device not in first:
            first[device] = int(snapshot)
    return first


def _run_flags(table: pd.DataFrame, by_run: dict[int, dict[str, dict]]) -> list[str]:
    flags = []
    for emulated, status, measurement in zip(table["emulated"], table["status"],
                                             table["measurement_id"], strict=True):
        found: list[str] = []
        if emulated:
            found.append("emulated")
        if status != "ok":
            found.append(str(status))
        phases = by_run.get(int(measurement), {})
        found += run_flags(phases.get("before"), phases.get("after"))
        flags.append("; ".join(dict.fromkeys(found)))
    return flags
